"""Fleet-wide pool accounting, computed once per change of its inputs rather than per reconcile.

Why: every ModelDeployment reconcile (its InsufficientPoolCapacity check) and every RegionPool
reconcile (its allocation status) needs `account(view.valid_pools(), view.demands())` over the
whole fleet. At 2,000 ModelDeployments that took 35-150 ms per reconcile (deriving the demands,
then sorting them and formatting a shortfall message per overcommitted placement), so a resync
cost minutes of CPU while the answer had not changed since the previous reconcile.

What the cache keys on, and why that is exact: `account` is a pure function of the pools (their
names in view order and their parsed specs) and of the demands (`fleet.Demand`, which carries
every field `account` reads: key, creationTimestamp, pool, instances, GPUs per instance). So the
cached result is reused iff the pools are equal, in the same order, and every ModelDeployment's
demands are equal to those it was computed from, with none added or removed. Demands are compared
rather than some fingerprint of the record: that covers whatever `demands_of` reads (spec,
`status.regions[].pool/current`, creationTimestamp; for an invalid spec the status regions and the
raw `spec.model.gpusPerInstance` of what still runs), including a spec changed without a new
generation (CRD defaults applied on read, see `spec_cache`), and ignores whatever it does not (a
status write that only moves `ready` or the conditions). Demands from different ModelDeployments
never tie in `account`'s first-come sort (the key includes `namespace/name`), so the order of the
records in the view cannot change the result.

What keeps it cheap: a record is re-derived only when it is not the very object seen last time
for its key. Kopf's index keeps one `ObjectRecord` per object until that object has an event, so
an unchanged fleet costs one identity check per ModelDeployment (about 0.2 ms at 2,000), plus
re-deriving the record each reconcile re-reads from the API server (and the index's copy of it on
the next call). A re-derived record whose demands come out equal keeps the old tuple, so only a
real change of demands recomputes the accounting. This relies on what `spec_cache` relies on:
nothing mutates an `ObjectRecord`'s spec or status dicts.

Owned by whoever runs reconciles (`runtime.Runtime`, one per operator), not a module global: two
operators in one process (tests, the demo) keep separate state, and the cache holds no more than
the last fleet it saw. Entries of ModelDeployments no longer in the view are dropped on the next
call, so deletions need no hook.

The returned `Accounting` is shared by every caller until the fleet changes: read it, never mutate
it (its `PoolUsage` values are mutable dataclasses only because `account` builds them in place).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from fleetwarden.api.v1alpha1 import RegionPoolSpec
from fleetwarden.operator.allocation import Accounting, Demand, account
from fleetwarden.operator.fleet import FleetView, ObjectRecord, demands_of


class _Entry:
    """One ModelDeployment's demands and the record object they were last checked against."""

    __slots__ = ("demands", "record")

    def __init__(self, record: ObjectRecord, demands: tuple[Demand, ...]) -> None:
        self.record = record
        self.demands = demands


def _same_pools(
    before: tuple[tuple[str, RegionPoolSpec], ...], now: Mapping[str, RegionPoolSpec]
) -> bool:
    """Same pool names in the same order (the order of `Accounting.usage`), with equal specs.

    Parsed specs come from `spec_cache`, so an unchanged pool is the same object: identity first.
    """
    if len(before) != len(now):
        return False
    return all(
        name == other_name and (spec is other_spec or spec == other_spec)
        for (name, spec), (other_name, other_spec) in zip(before, now.items(), strict=True)
    )


class AccountingCache:
    """The last fleet accounting and, per ModelDeployment, the demands it was computed from.

    Thread-safe (one lock around each call) although the operator calls it only from its event
    loop: `account` has no await inside, so coroutines cannot interleave in it, but a second
    thread sharing the cache would otherwise tear the entries and the result apart.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._pools: tuple[tuple[str, RegionPoolSpec], ...] = ()
        self._result: Accounting | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """ModelDeployments whose demands are kept."""
        return len(self._entries)

    def account(self, view: FleetView) -> Accounting:
        """`account(view.valid_pools(), view.demands())`, recomputed only when an input changed."""
        pools = view.valid_pools()
        with self._lock:
            self._refresh(view.model_deployments)
            if self._result is not None and _same_pools(self._pools, pools):
                return self._result
            entries = self._entries
            demands = [d for key in view.model_deployments for d in entries[key].demands]
            result = account(pools, demands)
            self._pools = tuple(pools.items())
            self._result = result
            return result

    def _refresh(self, records: Mapping[str, ObjectRecord]) -> None:
        """Bring the entries in line with `records`, dropping the kept result as soon as any
        ModelDeployment's demands change, appear or go away.

        Dropped at once, not flagged for the caller: if deriving a later record raises, the
        entries already updated no longer match the result, and the next call must recompute.
        """
        entries = self._entries
        for key, record in records.items():
            entry = entries.get(key)
            if entry is not None and entry.record is record:
                continue
            demands = demands_of(record)
            if entry is None:
                entries[key] = _Entry(record, demands)
                self._result = None
            else:
                entry.record = record
                if entry.demands != demands:
                    entry.demands = demands
                    self._result = None
        if len(entries) > len(records):  # every key of `records` has an entry by now
            for key in [k for k in entries if k not in records]:
                del entries[key]
            self._result = None

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._pools = ()
            self._result = None


def fleet_accounting(view: FleetView, cache: AccountingCache | None = None) -> Accounting:
    """The fleet's accounting through `cache`, or computed afresh without one (hand-made views
    in tests, one-off callers)."""
    if cache is None:
        return account(view.valid_pools(), view.demands())
    return cache.account(view)
