"""Bounded label values for the per-tenant metric families.

The tenant label comes from the trusted header or, failing that, the OpenAI `user` field, and the
application label from a header: values a client chooses. Every new value is a new series in
each per-tenant family for as long as the process lives, so a client sending a fresh `user` per
call would grow the sidecar's memory and its `/metrics` without bound, and with them Prometheus.
A `LabelBudget` passes through the names the config knows (its tenants or its applications)
and the first `limit` others; any later value is counted under `OTHER`, which no tenant or
application can be named (names start with a letter or digit, `identity._NAME`).

Both values are the client's, so their combinations are bounded too (`TenantAppLabels`): at
most `PAIRS_PER_TENANT_LABEL` pairs per tenant label on average, beyond which a new pair is
counted under `_other` for the application and, unless the config names it, the tenant. Each pair
is 24 series across the two families (3 tiers x 2 kinds, 3 tiers x 6 outcomes), so 1,000
tenants and 100 applications would otherwise allow 2.4 million of them.

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
PAIRS_PER_TENANT_LABEL = 4
"""Distinct (tenant, application) label pairs allowed per tenant label, on average."""


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

    def known(self, value: str) -> bool:
        return value in self._known

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


class TenantAppLabels:
    """The (tenant, application) labels of one request: each value through its own budget, and
    at most `max_pairs` distinct pairs besides those of config-named tenants and applications."""

    def __init__(self, max_tenants: int, max_apps: int) -> None:
        self.tenants = LabelBudget("tenant", max_tenants, "--max-tenant-labels")
        self.apps = LabelBudget("application", max_apps, "--max-app-labels")
        self.max_pairs = PAIRS_PER_TENANT_LABEL * max(max_tenants, 1)
        self._pairs: set[tuple[str, str]] = set()
        self.folded = False
        """Whether some pair has been folded for the pair cap (logged once)."""

    def configure(self, tenants: Iterable[str], apps: Iterable[str]) -> None:
        self.tenants.configure(tenants)
        self.apps.configure(apps)

    def labels(self, tenant: str, app: str) -> tuple[str, str]:
        pair = (self.tenants.label(tenant), self.apps.label(app))
        pairs = self._pairs
        if pair in pairs:
            return pair
        tenant_label, app_label = pair
        known_tenant = self.tenants.known(tenant_label)
        if len(pairs) < self.max_pairs or (
            known_tenant and (not app_label or self.apps.known(app_label))
        ):
            pairs.add(pair)
            return pair
        if not self.folded:
            self.folded = True
            log.warning(
                "more than %d (tenant, application) label pairs have been seen: later pairs are "
                "counted under application %r (and tenant %r unless the config names it)",
                self.max_pairs,
                OTHER,
                OTHER,
            )
        folded = (tenant_label if known_tenant else OTHER, OTHER)
        pairs.add(folded)
        return folded


__all__ = ["OTHER", "PAIRS_PER_TENANT_LABEL", "LabelBudget", "TenantAppLabels"]
