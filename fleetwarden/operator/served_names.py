"""Two ModelDeployments serving one model name in one region would share their series.

Every signal the control loop reads is keyed by served model and region: the sidecars' metrics
(`{model, region}` labels), hence utilisation, tokens/s history, forecasts, the scaler's input,
the NIW backlog and the batch queue. Two ModelDeployments with the same `servedName` in the same
region (in one namespace or two) would each read the sum of both, and each would scale for the
other's load. Rather than mix them silently, the later one (creation time, then namespace/name,
the same first-come order as pool accounting) is told so in its status and events.

The check runs on every ModelDeployment reconcile. Scanning the fleet for each one (sorted, every
spec looked up) cost 3-4 ms at 2,000 ModelDeployments, so a resync of the fleet was quadratic:
seconds of the operator's event loop. `ServedNameIndex` keeps, per ModelDeployment, its served
name and pools, re-read only when the record is not the very object seen last time (as
`accounting_cache` does), and groups them by served name, so a reconcile looks at the
ModelDeployments that share its name and nothing else.

Pure (no I/O); owned by the runtime, one per operator.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec
from fleetwarden.operator.fleet import FleetView, ObjectRecord, parse_model_deployment, parse_pool

Order = tuple[str, str]
"""(creationTimestamp, namespace/name): who came first."""


class _Entry:
    """What one ModelDeployment's record says about its served name, and the record read."""

    __slots__ = ("pools", "record", "served_name")

    def __init__(self, record: ObjectRecord) -> None:
        self.record = record
        spec = parse_model_deployment(record).spec
        self.served_name = None if spec is None else spec.served_name
        self.pools: tuple[str, ...] = () if spec is None else tuple(p.pool for p in spec.regions)


class ServedNameIndex:
    """The fleet's ModelDeployments grouped by served name, kept between reconciles.

    Thread-safe (one lock per call) for the same reason as `AccountingCache`. Entries of
    ModelDeployments no longer in the view are dropped on the next call, so deletions need no
    hook.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._by_name: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """ModelDeployments indexed."""
        return len(self._entries)

    def conflicts(
        self, view: FleetView, record: ObjectRecord, spec: ModelDeploymentSpec
    ) -> list[str]:
        """One message per older ModelDeployment serving `spec.served_name` in a shared region,
        oldest first."""
        with self._lock:
            self._refresh(view.model_deployments)
            order = (record.created, record.key)
            rivals = [
                entry
                for key in self._by_name.get(spec.served_name, ())
                if key != record.key and ((entry := self._entries[key]).record.created, key) < order
            ]
        if not rivals:
            return []
        regions = _PoolRegions(view)
        mine = regions.of(p.pool for p in spec.regions)
        messages = []
        for other in sorted(rivals, key=lambda e: (e.record.created, e.record.key)):
            shared = sorted(mine & regions.of(other.pools))
            if shared:
                messages.append(
                    f"ModelDeployment {other.record.key} (older) also serves model "
                    f"{spec.served_name!r} in {', '.join(shared)}: metrics, forecasts, scaling "
                    "signals and the batch queue are keyed by served model and region, so both "
                    "would read the sum of their loads; give this one another servedName"
                )
        return messages

    def serving(self, served_name: str) -> set[str]:
        """Keys of the ModelDeployments serving `served_name` as of the last refresh (a deleted
        one stays listed until the next), for the runtime to wake them when a rival changes."""
        with self._lock:
            return set(self._by_name.get(served_name, ()))

    def _refresh(self, records: Mapping[str, ObjectRecord]) -> None:
        entries, by_name = self._entries, self._by_name
        for key, record in records.items():
            entry = entries.get(key)
            if entry is not None and entry.record is record:
                continue
            fresh = _Entry(record)
            if entry is not None and entry.served_name != fresh.served_name:
                self._unname(key, entry.served_name)
            if fresh.served_name is not None:
                by_name.setdefault(fresh.served_name, set()).add(key)
            entries[key] = fresh
        if len(entries) > len(records):  # every key of `records` has an entry by now
            for key in [k for k in entries if k not in records]:
                self._unname(key, entries.pop(key).served_name)

    def _unname(self, key: str, served_name: str | None) -> None:
        if served_name is None:
            return
        keys = self._by_name.get(served_name)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_name[served_name]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._by_name.clear()


class _PoolRegions:
    """Pool name to region, each pool parsed once per call (and only pools a rival names)."""

    def __init__(self, view: FleetView) -> None:
        self._view = view
        self._regions: dict[str, str | None] = {}

    def of(self, pools: Iterable[str]) -> set[str]:
        found = set()
        for name in pools:
            if name not in self._regions:
                record = self._view.pools.get(name)
                pool = parse_pool(record).spec if record is not None else None
                self._regions[name] = pool.region if pool is not None else None
            region = self._regions[name]
            if region is not None:
                found.add(region)
        return found


def served_name_conflicts(
    view: FleetView,
    record: ObjectRecord,
    spec: ModelDeploymentSpec,
    index: ServedNameIndex | None = None,
) -> list[str]:
    """`index.conflicts(...)` through the runtime's index, or through a fresh one (hand-made views
    in tests, one-off callers: linear in the fleet)."""
    return (index if index is not None else ServedNameIndex()).conflicts(view, record, spec)


__all__ = ["ServedNameIndex", "served_name_conflicts"]
