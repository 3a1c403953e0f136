"""The fleet's pool accounting is computed once per change, and always equals the uncached one.

`AccountingCache.account(view)` must return exactly `account(view.valid_pools(), view.demands())`
for every view, while an unchanged fleet costs no `account` call at all. Real computations are
counted by wrapping the names the cache calls (`accounting_cache.account`, `.demands_of`), never
timed.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fleetwarden.operator.accounting_cache as accounting_cache
from fleetwarden.operator.accounting_cache import AccountingCache, fleet_accounting
from fleetwarden.operator.allocation import Accounting, account
from fleetwarden.operator.fleet import (
    MODEL_DEPLOYMENT_SPECS,
    POOL_SPECS,
    FleetView,
    ObjectRecord,
    demands_of,
)
from fleetwarden.operator.main import OperatorSettings
from fleetwarden.operator.reconcilers.context import Context
from fleetwarden.operator.runtime import Runtime
from tests.support.fleet_operator import example_objects, running_operator
from tests.support.kube_emulator import KubeEmulator

NS = "team"
NOW = "2026-01-01T00:00:00Z"
POOLS = ("p0", "p1", "p2")
GHOST = "ghost"
"""A pool no RegionPool defines: its demands are skipped by `account`."""

Region = tuple[str, int, int]
"""(pool, minInstances, maxInstances)."""


@pytest.fixture(autouse=True)
def empty_spec_caches() -> Iterator[None]:
    for cache in (MODEL_DEPLOYMENT_SPECS, POOL_SPECS):
        cache.clear()
    yield
    for cache in (MODEL_DEPLOYMENT_SPECS, POOL_SPECS):
        cache.clear()


def pool(
    name: str,
    gpus: int | None = 8,
    instances: int | None = None,
    *,
    valid: bool = True,
    generation: int = 1,
) -> ObjectRecord:
    capacity: Any = {k: v for k, v in (("gpus", gpus), ("instances", instances)) if v is not None}
    if not valid:
        capacity = "not a capacity"
    return ObjectRecord(
        name=name,
        namespace=None,
        uid=f"uid-{name}",
        generation=generation,
        created="2026-01-01T00:00:00Z",
        labels={},
        spec={
            "region": f"r-{name}",
            "gpuType": "A100-80GB",
            "capacity": capacity,
            "costPerHour": 1,
        },
        status={},
        api_version="fleetwarden.dev/v1alpha1",
        kind="RegionPool",
    )


def md(
    name: str,
    regions: list[Region],
    *,
    gpus_per_instance: int = 1,
    current: dict[str, Any] | None = None,
    created: str = "2026-01-01T00:00:00Z",
    uid: str | None = None,
) -> ObjectRecord:
    """A ModelDeployment; `current` is the per-pool `status.regions[].current` planned_replicas
    reads (any value: non-integers are ignored there, as in a real status)."""
    return ObjectRecord(
        name=name,
        namespace=NS,
        uid=uid or f"uid-{name}",
        generation=1,
        created=created,
        labels={},
        spec={
            "model": {"name": f"org/{name}", "gpusPerInstance": gpus_per_instance},
            "throughput": {"A100-80GB": 1000},
            "regions": [
                {"pool": p, "minInstances": lo, "maxInstances": hi} for p, lo, hi in regions
            ],
        },
        status={"regions": [{"pool": p, "current": c} for p, c in (current or {}).items()]},
        api_version="fleetwarden.dev/v1alpha1",
        kind="ModelDeployment",
    )


def refetched(record: ObjectRecord) -> ObjectRecord:
    """The same object as a fresh GET returns it: equal content, new dicts (Runtime.fresh_view)."""
    return replace(record, spec=copy.deepcopy(record.spec), status=copy.deepcopy(record.status))


def assert_exact(cached: Accounting, view: FleetView) -> None:
    """`cached` is what the uncached accounting of `view` gives, down to the order of pools."""
    expected = account(view.valid_pools(), view.demands())
    assert cached == expected
    assert list(cached.usage) == list(expected.usage)
    for key in view.model_deployments:
        assert cached.shortfalls_of(key) == expected.shortfalls_of(key)


@dataclass
class Calls:
    """Real computations the cache asked for."""

    account: int = 0
    demands_of: list[str] = field(default_factory=list)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    counted = Calls()

    def counting_account(*args: Any) -> Accounting:
        counted.account += 1
        return account(*args)

    def counting_demands_of(record: ObjectRecord) -> Any:
        counted.demands_of.append(record.key)
        return demands_of(record)

    monkeypatch.setattr(accounting_cache, "account", counting_account)
    monkeypatch.setattr(accounting_cache, "demands_of", counting_demands_of)
    return counted


def overcommitted_fleet(size: int = 20) -> tuple[list[ObjectRecord], list[ObjectRecord]]:
    pools = [pool("p0", gpus=10), pool("p1", gpus=None, instances=4), pool("p2", gpus=100)]
    mds = [
        md(
            f"m{i:02d}",
            [("p0", 1, 4), ("p1", 0, 3), *([("p2", 1, 2)] if i % 2 else [])],
            gpus_per_instance=1 + i % 3,
            current={"p0": 1 + i % 4},
            created=f"2026-01-01T00:00:{i % 7:02d}Z",  # ties: namespace/name breaks them
        )
        for i in range(size)
    ]
    return pools, mds


# --- property: any sequence of changes -----------------------------------------------------------

names = st.sampled_from(["m0", "m1", "m2"])
placements = st.tuples(st.sampled_from((*POOLS, GHOST)), st.integers(0, 3), st.integers(0, 3))
regions = st.lists(
    placements.map(lambda r: (r[0], r[1], max(1, r[1] + r[2]))),
    unique_by=lambda r: r[0],
    max_size=3,
)  # valid ones: "invalid_md" makes the others
currents = st.one_of(st.integers(0, 6), st.sampled_from([-1, None, "2", True]))
created = st.sampled_from(["2025-12-31T00:00:00Z", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"])
capacities = st.one_of(st.none(), st.integers(1, 12))

changes = st.one_of(
    st.tuples(st.just("put_md"), names, regions, st.integers(1, 4), st.booleans()),
    st.tuples(st.just("remove_md"), names),
    st.tuples(st.just("invalid_md"), names, st.booleans()),
    st.tuples(st.just("current"), names, st.sampled_from((*POOLS, GHOST)), currents),
    st.tuples(st.just("ready"), names, st.integers(0, 5)),
    st.tuples(st.just("broken_status"), names),
    st.tuples(st.just("created"), names, created),
    st.tuples(st.just("recreate"), names, created),
    st.tuples(st.just("generation"), names),
    st.tuples(st.just("refetch"), names),
    st.tuples(st.just("put_pool"), st.sampled_from(POOLS), capacities, capacities, st.booleans()),
    st.tuples(st.just("remove_pool"), st.sampled_from(POOLS)),
    st.tuples(st.just("pool_status"), st.sampled_from(POOLS), st.integers(0, 9)),
    st.tuples(st.just("rotate")),
)


class Fleet:
    """A fleet that changes the way Kopf's index does: one new record per changed object, the
    same record object for every other one."""

    def __init__(self) -> None:
        self.pools: dict[str, ObjectRecord] = {}
        self.mds: dict[str, ObjectRecord] = {}
        self.uids = 0

    @classmethod
    def of(cls, pools: list[ObjectRecord], mds: list[ObjectRecord]) -> Fleet:
        fleet = cls()
        fleet.pools = {r.name: r for r in pools}
        fleet.mds = {r.name: r for r in mds}
        return fleet

    def _status(self, record: ObjectRecord, pool_name: str, key: str, value: Any) -> ObjectRecord:
        """A status write setting `key` of one region's entry (as the reconciler's does)."""
        status = copy.deepcopy(record.status)
        entries = [r for r in status.get("regions") or [] if isinstance(r, dict)]
        status["regions"] = entries
        entry = next((r for r in entries if r.get("pool") == pool_name), None)
        if entry is None:
            entry = {"pool": pool_name}
            entries.append(entry)
        entry[key] = value
        return replace(record, spec=copy.deepcopy(record.spec), status=status)

    def apply(self, change: tuple[Any, ...]) -> None:
        kind, *args = change
        if kind == "put_md":
            name, placed, gpi, bump = args
            before = self.mds.get(name)
            if before is None:
                self.uids += 1
                self.mds[name] = md(name, placed, gpus_per_instance=gpi, uid=f"u{self.uids}")
            else:  # a spec edit; `bump` False is a spec change without a new generation
                fresh = md(name, placed, gpus_per_instance=gpi)
                generation = (before.generation or 0) + (1 if bump else 0)
                self.mds[name] = replace(
                    before,
                    spec=fresh.spec,
                    status=copy.deepcopy(before.status),
                    generation=generation,
                )
        elif kind == "current" and args[0] in self.mds:
            self.mds[args[0]] = self._status(self.mds[args[0]], args[1], "current", args[2])
        elif kind == "ready" and args[0] in self.mds:
            self.mds[args[0]] = self._status(self.mds[args[0]], POOLS[0], "ready", args[1])
        elif kind == "invalid_md" and args[0] in self.mds:  # min > max, or a pool twice
            record = refetched(self.mds[args[0]])
            twice = [{"pool": "p0", "maxInstances": 2}] * 2
            record.spec["regions"] = (
                twice if args[1] else [{"pool": "p0", "minInstances": 3, "maxInstances": 1}]
            )
            self.mds[args[0]] = replace(record, generation=(record.generation or 0) + 1)
        elif kind == "broken_status" and args[0] in self.mds:  # deriving its demands raises
            self.mds[args[0]] = replace(refetched(self.mds[args[0]]), status={"regions": ["x"]})
        elif kind == "remove_md":
            self.mds.pop(args[0], None)
        elif kind == "created" and args[0] in self.mds:
            self.mds[args[0]] = replace(refetched(self.mds[args[0]]), created=args[1])
        elif kind == "recreate" and args[0] in self.mds:
            self.uids += 1
            old = self.mds.pop(args[0])
            self.mds[args[0]] = replace(
                refetched(old), uid=f"u{self.uids}", generation=1, created=args[1], status={}
            )
        elif kind == "generation" and args[0] in self.mds:
            record = self.mds[args[0]]
            self.mds[args[0]] = replace(refetched(record), generation=(record.generation or 0) + 1)
        elif kind == "refetch" and args[0] in self.mds:
            self.mds[args[0]] = refetched(self.mds[args[0]])
        elif kind == "put_pool":
            name, gpus, instances, valid = args
            if gpus is None and instances is None:
                valid = False
            generation = (self.pools[name].generation or 0) + 1 if name in self.pools else 1
            self.pools[name] = pool(name, gpus, instances, valid=valid, generation=generation)
        elif kind == "remove_pool":
            self.pools.pop(args[0], None)
        elif kind == "pool_status" and args[0] in self.pools:
            record = self.pools[args[0]]
            self.pools[args[0]] = replace(refetched(record), status={"allocatedGpus": args[1]})
        elif kind == "rotate":  # the index lists objects in another order
            self.pools = dict(list(self.pools.items())[1:] + list(self.pools.items())[:1])
            self.mds = dict(list(self.mds.items())[1:] + list(self.mds.items())[:1])

    def view(self, fresh: str | None) -> FleetView:
        view = FleetView.of(self.pools.values(), self.mds.values())
        if fresh is not None and fresh in self.mds:  # Runtime.fresh_view re-reads one object
            view = view.with_fresh(refetched(self.mds[fresh]))
        return view


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(changes, st.one_of(st.none(), names)), max_size=30))
def test_cached_accounting_equals_uncached_after_any_changes(
    steps: list[tuple[tuple[Any, ...], str | None]],
) -> None:
    fleet = Fleet()
    for name, gpus in zip(POOLS, (2, 6, 6), strict=True):  # p0 full: first come counts
        fleet.apply(("put_pool", name, gpus, None, True))
    fleet.apply(("put_md", "m0", [("p0", 1, 4), ("p1", 0, 3)], 2, True))
    fleet.apply(("put_md", "m1", [("p0", 1, 2), ("p2", 1, 1)], 1, True))
    cache = AccountingCache()
    for change, fresh in steps:
        fleet.apply(change)
        view = fleet.view(fresh)
        try:
            expected = account(view.valid_pools(), view.demands())
        except AttributeError:  # a status entry that is not a mapping: both must refuse
            with pytest.raises(AttributeError):
                cache.account(view)
            continue
        assert cache.account(view) == expected
        assert_exact(cache.account(view), view)  # and again, from the kept result
        assert len(cache) == len(view.model_deployments)


# --- an unchanged fleet ---------------------------------------------------------------------------


def test_an_unchanged_fleet_is_accounted_once(calls: Calls) -> None:
    pools, mds = overcommitted_fleet()
    cache = AccountingCache()
    first = cache.account(FleetView.of(pools, mds))
    assert calls.account == 1
    assert len(calls.demands_of) == len(mds)
    calls.demands_of.clear()
    for record in [*mds, *mds]:  # two resyncs: each reconcile re-reads its own object
        view = FleetView.of(pools, mds).with_fresh(refetched(record))
        assert cache.account(view) is first
        assert len(calls.demands_of) <= 2  # the re-read record, and the index's one after it
        calls.demands_of.clear()
    for p in pools:  # pool reconciles re-read their pool: equal spec, new dicts
        assert cache.account(FleetView.of(pools, mds).with_fresh(refetched(p))) is first
    assert calls.account == 1
    assert_exact(first, FleetView.of(pools, mds))
    assert first.shortfalls  # the fleet is overcommitted: the kept result has messages to give


def test_status_writes_that_move_no_replicas_do_not_recompute(calls: Calls) -> None:
    fleet = Fleet.of(*overcommitted_fleet())
    cache = AccountingCache()
    first = cache.account(fleet.view(None))
    for name in list(fleet.mds):
        fleet.apply(("ready", name, 2))  # ready moved, current did not
        fleet.apply(("current", name, "p1", "not a count"))  # ignored by planned_replicas
    fleet.apply(("generation", "m01"))  # a new generation without a spec change
    fleet.apply(("pool_status", "p0", 7))
    view = fleet.view("m02")
    assert cache.account(view) is first
    assert calls.account == 1
    assert_exact(first, view)


# --- every input that matters invalidates ---------------------------------------------------------

EDITED = [("p0", 1, 4), ("p1", 3, 3)]
INVALIDATING: dict[str, tuple[Any, ...]] = {  # `Fleet.apply` changes of `overcommitted_fleet`
    "md added": ("put_md", "late", [("p0", 2, 2)], 1, True),
    "md removed": ("remove_md", "m00"),
    "md recreated later (uid, creationTimestamp)": ("recreate", "m00", "2026-01-01T00:00:09Z"),
    "md creationTimestamp": ("created", "m03", "2025-12-31T00:00:00Z"),
    "spec edit, new generation": ("put_md", "m05", EDITED, 3, True),
    "spec edit, same generation (CRD default)": ("put_md", "m05", EDITED, 3, False),
    "gpusPerInstance": ("put_md", "m02", [("p0", 1, 4), ("p1", 0, 3)], 4, True),
    "region moved to another pool": ("put_md", "m02", [("p2", 1, 4), ("p1", 0, 3)], 3, True),
    "spec made invalid": ("invalid_md", "m02", False),
    "status current raised": ("current", "m04", "p0", 4),
    "status current added for a region": ("current", "m04", "p1", 2),
    "status current above max (clamped to max)": ("current", "m04", "p0", 9),
    "pool capacity": ("put_pool", "p0", 11, None, True),
    "pool instance capacity": ("put_pool", "p1", None, 5, True),
    "pool made invalid": ("put_pool", "p2", 100, None, False),
    "pool added": ("put_pool", "p3", 1, None, True),
    "pool removed": ("remove_pool", "p1"),
    "objects listed in another order": ("rotate",),
}


@pytest.mark.parametrize("name", sorted(INVALIDATING))
def test_each_input_that_matters_invalidates(name: str, calls: Calls) -> None:
    fleet = Fleet.of(*overcommitted_fleet())
    cache = AccountingCache()
    before = cache.account(fleet.view(None))
    fleet.apply(INVALIDATING[name])
    view = fleet.view(None)
    after = cache.account(view)
    assert calls.account == 2
    assert_exact(after, view)
    assert (after, list(after.usage)) != (before, list(before.usage))  # the change shows
    assert cache.account(fleet.view(None)) is after  # and is kept from then on
    assert calls.account == 2


def test_a_failed_derivation_leaves_no_stale_result() -> None:
    """One record changed, a later one raised: the next call must still see the first change."""
    fleet = Fleet.of(*overcommitted_fleet(4))
    cache = AccountingCache()
    cache.account(fleet.view(None))
    unbroken = fleet.mds["m03"]
    fleet.apply(("current", "m00", "p0", 4))
    fleet.apply(("broken_status", "m03"))
    with pytest.raises(AttributeError):
        cache.account(fleet.view(None))
    fleet.mds["m03"] = unbroken  # the very record the cache kept for m03
    view = fleet.view(None)
    assert_exact(cache.account(view), view)


# --- who owns it ------------------------------------------------------------------------------


def test_without_a_cache_the_accounting_is_computed_afresh(calls: Calls) -> None:
    pools, mds = overcommitted_fleet(5)
    view = FleetView.of(pools, mds)
    for _ in range(3):
        assert_exact(fleet_accounting(view), view)
    assert calls.account == 3


async def test_resyncs_of_an_unchanged_fleet_reuse_the_accounting(calls: Calls) -> None:
    """The operator, run against the Kubernetes API emulator: once the example fleet has
    settled, periodic resyncs reconcile every ModelDeployment and RegionPool again (each asks
    for the fleet's accounting, with records freshly read from the API) and nothing recomputes
    it; the statuses written are those of the uncached accounting (no write at all)."""
    settings = OperatorSettings(peering_name=None, resync_seconds=0.3)
    async with KubeEmulator() as emulator, running_operator(emulator, settings) as op:
        await op.apply(o for o in example_objects() if o["kind"] != "Namespace")
        await op.settle(quiet_s=0.5)
        assert calls.account >= 1
        before, mark = calls.account, emulator.mark()
        await emulator.wait_for(
            lambda: sum("/regionpools/" in r.path for r in emulator.requests[mark:]) >= 6,
            timeout=10,
        )
        await op.settle(quiet_s=0.5)
        assert calls.account == before
        assert emulator.writes_since(mark) == []
        view = op.runtime.view()
        assert_exact(op.runtime.accounting.account(view), view)


def _runtime() -> Runtime:
    context = Context(
        kube=cast(Any, None), events=cast(Any, None), sidecar_image="x", now=lambda: NOW
    )
    return Runtime(context)


def test_each_runtime_owns_its_cache() -> None:
    assert _runtime().accounting is not _runtime().accounting
