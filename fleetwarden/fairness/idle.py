"""Which tenants have been idle long enough for the scheduler to forget them.

A tenant is whoever the sidecar says it is: the trusted header, else the OpenAI `user` field,
which applications commonly fill with their own end users' ids. VTC and WSC keep a counter and a
queue record per tenant they ever saw (about 1.25 KB with VTC, 2 KB with length prediction,
measured with `tracemalloc`), so a million distinct `user` values would keep a sidecar holding
gigabytes, and a client could grow it on purpose. The scheduler therefore forgets a tenant that
has had nothing queued and nothing running for `TenantRetention.forget_after_s`, or sooner when
more than `max_idle` tenants are idle (the longest idle first): memory is then bounded by the
tenants seen in that window, not since start-up.

Forgetting is where this departs from VTC as written, and only for a returning tenant whose
counter is still above the queue's floor: VTC lifts a returning tenant to the floor (no credit
for time away), so a tenant at or below it returns to the same counter either way; one above it,
served more than the others before it left, returns to the floor instead of keeping that debt.
The floor rises with whatever the others are served while it is away, so a debt outlives ten idle
minutes (the default) only when the others were served less than it in all that time.

Pure: the caller passes `now`; the order of forgetting is the order tenants went idle.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TenantRetention:
    """How long, and how many, idle tenants a scheduler keeps state for."""

    forget_after_s: float = 600.0
    """Idle time after which a tenant's counters and queue record are dropped (`math.inf`: never
    by time)."""
    max_idle: int = 100_000
    """Most idle tenants kept at once; beyond it the longest idle are forgotten first."""

    def __post_init__(self) -> None:
        if math.isnan(self.forget_after_s) or self.forget_after_s < 0:
            raise ValueError(f"forget_after_s must be >= 0, got {self.forget_after_s!r}")
        if self.max_idle < 0:
            raise ValueError(f"max_idle must be >= 0, got {self.max_idle!r}")


class IdleTenants:
    """Tenants with nothing queued or running, oldest idle first; O(1) per change.

    An `OrderedDict`, not a dict: taking the oldest entry over and over from a plain dict's front
    scans the deleted slots it leaves behind, an `OrderedDict` unlinks it.
    """

    def __init__(self, retention: TenantRetention | None = None) -> None:
        self.retention = retention or TenantRetention()
        self._since: OrderedDict[str, float] = OrderedDict()
        self.next_check_s = math.inf
        """No tenant expires before this time: `expired` is asked on every arrival and every
        finished request, and until then it returns at once. Never later than the true first
        expiry (a tenant leaving the front only makes it early, and the next call recomputes)."""

    def __len__(self) -> int:
        return len(self._since)

    def __contains__(self, tenant: object) -> bool:
        return tenant in self._since

    def busy(self, tenant: str) -> None:
        """The tenant has work again: it is not idle (nothing happens if it was not)."""
        self._since.pop(tenant, None)

    def idle(self, tenant: str, now: float) -> None:
        """The tenant's last queued or running request just left, at `now`."""
        since = self._since
        since[tenant] = now
        since.move_to_end(tenant)
        if len(since) > self.retention.max_idle:
            self.next_check_s = -math.inf
        elif now + self.retention.forget_after_s < self.next_check_s:
            self.next_check_s = now + self.retention.forget_after_s

    def expired(self, now: float) -> tuple[str, ...]:
        """Remove and return the tenants to forget at `now`, longest idle first."""
        if now < self.next_check_s:
            return ()
        since, retention = self._since, self.retention
        cutoff = now - retention.forget_after_s
        gone: list[str] = []
        self.next_check_s = math.inf
        while since:
            tenant, idle_since = next(iter(since.items()))
            if idle_since > cutoff and len(since) <= retention.max_idle:
                self.next_check_s = idle_since + retention.forget_after_s
                break
            since.popitem(last=False)
            gone.append(tenant)
        return tuple(gone)


__all__ = ["IdleTenants", "TenantRetention"]
