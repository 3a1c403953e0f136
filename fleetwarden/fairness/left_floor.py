"""The empty-queue floor of VTC-style lifts, kept when the last tenant to leave is forgotten.

VTC (Sheng et al., Algorithm 2, lines 7-13) and FairServe's WSC (section 4.3) lift a tenant that
joins an empty queue to the counter of the last tenant to leave it, so time spent away earns no
credit. Both policies also forget idle tenants (`fairness.idle`, a departure from the papers that
`docs/decisions.md` records), dropping their counters. Forgetting the last leaver must not drop
the floor with it: a joiner would then start at its own (often zero) counter, below everyone
served since, which is the credit the lift exists to deny. So the forgotten leaver's counter is
kept as a bare number, the floor until the next tenant leaves.
"""

from __future__ import annotations


class LeftFloor:
    """Mixin for a policy with `counters` that lifts a tenant joining an empty queue.

    The policy records each dispatching tenant in `_last_left` (the queue's last leaver when it
    empties), reads the floor with `_left_counter`, and calls `_forget_counter` from `forget`
    once it has checked that the tenant has nothing queued; dropping its own queue records stays
    with the policy.
    """

    counters: dict[str, float]
    """Each known tenant's counter; the policy owns it."""

    def __init__(self) -> None:
        self._last_left: str | None = None
        """The last tenant to leave the queue (by dispatch), while it is still known."""
        self._left_floor: float | None = None
        """The counter of the last tenant to leave the queue once that tenant was forgotten: the
        floor of a tenant joining an empty queue (`_last_left` is then None)."""

    def _left_counter(self) -> float | None:
        """The counter of the last tenant to leave the queue, the floor when it is empty."""
        if self._last_left is not None:
            return self.counters[self._last_left]
        return self._left_floor

    def _forget_counter(self, tenant: str) -> None:
        """Drop the tenant's counter, keeping it as the empty-queue floor if the tenant was the
        last to leave the queue (see the module docstring)."""
        if tenant == self._last_left:
            self._left_floor = self.counters[tenant]
            self._last_left = None
        self.counters.pop(tenant, None)


__all__ = ["LeftFloor"]
