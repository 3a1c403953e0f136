"""The fleet's ModelDeployments by pool: all of them (a Kopf index), and the Degraded ones.

Every ModelDeployment by pool: `pool_user_entries` is the function of the Kopf index
(`handlers/indices.py`) that Kopf keeps up to date on every ModelDeployment event, in the same
step as the records index (so the two never disagree between events), and drops on deletion.
The RegionPool handler and spot sharing read a pool's users from it
(`FleetView.model_deployments_using`, `Runtime.pool_users`) instead of scanning every
ModelDeployment per event.

The Degraded ones, kept between scaling steps:

`runtime.rivals` wakes the younger Degraded users of the pools a ModelDeployment's change
touched, on every scaling step of every ModelDeployment. Finding them with
`FleetView.model_deployments_using` scanned and sorted every ModelDeployment once per pool
(17-68 ms a step at 2,000 ModelDeployments x 5 regions, tens of seconds of the event loop per
fleet-wide scaling round). `DegradedUsers` keeps, per ModelDeployment, the pools its spec names
and whether its status says Degraded, re-read only when the record is not the very object seen
last time (as `served_names.ServedNameIndex` does), so a step costs an identity check per
ModelDeployment and a look at the few Degraded users of its pools.

Pure (no I/O). Kopf owns the pool-users index; `DegradedUsers` is the runtime's, one per operator.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from fleetwarden.operator.conditions import DEGRADED
from fleetwarden.operator.fleet import (
    FleetView,
    ObjectRecord,
    named_pools,
    object_key,
    pools_named_in,
)


def pool_user_entries(body: Mapping[str, Any]) -> dict[str, str]:
    """What the pool-users index holds for one ModelDeployment: its key under every pool its raw
    spec names (what `model_deployments_using` matches); none for a spec naming no pool.

    Read straight from the body (no `ObjectRecord`, no copy): it runs on every event of every
    ModelDeployment, our own status writes included. Never raises (`pools_named_in`).
    """
    metadata = body.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    key = object_key(metadata.get("namespace"), str(metadata.get("name", "")))
    return dict.fromkeys(sorted(pools_named_in(body.get("spec"))), key)


def degraded(record: ObjectRecord) -> bool:
    """Whether the record's status says Degraded=True (the reconciler's summary of problems)."""
    for condition in record.status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == DEGRADED:
            return condition.get("status") == "True"
    return False


class DegradedUsers:
    """Pool -> keys of the Degraded ModelDeployments whose spec names it.

    Thread-safe (one lock per call) like `ServedNameIndex`. Entries of ModelDeployments no
    longer in the view are dropped on the next call, so deletions need no hook.
    """

    def __init__(self) -> None:
        self._entries: dict[str, tuple[ObjectRecord, frozenset[str]]] = {}
        """Key -> (record read, pools it is listed under: none unless Degraded)."""
        self._by_pool: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """ModelDeployments indexed."""
        return len(self._entries)

    def using(self, view: FleetView, pools: Iterable[str]) -> set[str]:
        """Keys of the Degraded ModelDeployments of `view` whose spec names one of `pools`."""
        with self._lock:
            self._refresh(view.model_deployments)
            found: set[str] = set()
            for pool in pools:
                found.update(self._by_pool.get(pool, ()))
            return found

    def _refresh(self, records: Mapping[str, ObjectRecord]) -> None:
        entries = self._entries
        for key, record in records.items():
            entry = entries.get(key)
            if entry is not None and entry[0] is record:
                continue
            listed = named_pools(record) if degraded(record) else frozenset()
            if entry is not None:
                self._unlist(key, entry[1] - listed)
            for pool in listed:
                self._by_pool.setdefault(pool, set()).add(key)
            entries[key] = (record, listed)
        if len(entries) > len(records):  # every key of `records` has an entry by now
            for key in [k for k in entries if k not in records]:
                self._unlist(key, entries.pop(key)[1])

    def _unlist(self, key: str, pools: Iterable[str]) -> None:
        for pool in pools:
            keys = self._by_pool.get(pool)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_pool[pool]


__all__ = ["DegradedUsers", "degraded", "named_pools", "pool_user_entries"]
