"""Bounded label values for the per-tenant metric families.

The tenant label comes from the trusted header or, failing that, the OpenAI `user` field, and the
application label from a header: values a client chooses. Every new value is a new series in
each per-tenant family for as long as the process lives, so a client sending a fresh `user` per
call would grow the sidecar's memory and its `/metrics` without bound, and with them Prometheus.
A `LabelBudget` passes through the names the config knows (its tenants or its applications)
and the first `limit` others; any later value is counted under `OTHER`, which no tenant or
application can be named (names start with a letter or digit, `identity._NAME`).

First come keeps its label for good: a series never moves from its own label to `_other`, so
each counter stays one monotone series. The fairness state of tenants is bounded separately
(`fairness.idle`); this bounds only what is exported.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

log = logging.getLogger(__name__)

OTHER = "_other"
"""The label of values beyond the budget."""


class LabelBudget:
    """Which label value one tenant (or application) is counted under."""

    def __init__(self, what: str, limit: int, option: str) -> None:
        if limit < 0:
            raise ValueError(f"the {what} label limit must be >= 0, got {limit}")
        self._what = what
        self._option = option
        self.limit = limit
        self._known: frozenset[str] = frozenset()
        self._admitted: set[str] = set()
        self.folded = False
        """Whether some value has been counted as `OTHER` (logged once)."""

    def configure(self, names: Iterable[str]) -> None:
        """The names the config lists: they always keep their own label, outside the budget."""
        self._known = frozenset(names)

    def label(self, value: str) -> str:
        """`value` itself while it is known or within the budget, else `OTHER`; "" stays ""."""
        if not value or value in self._admitted or value in self._known:
            return value
        if len(self._admitted) < self.limit:
            self._admitted.add(value)
            return value
        if not self.folded:
            self.folded = True
            log.warning(
                "more than %d %ss not named in the fairness config have been seen: later ones "
                "are counted under the label %r (raise %s to see more)",
                self.limit,
                self._what,
                OTHER,
                self._option,
            )
        return OTHER


__all__ = ["OTHER", "LabelBudget"]
