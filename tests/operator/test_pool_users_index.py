"""A pool's ModelDeployments come from an index Kopf keeps, not from a scan of the fleet.

`FleetView.model_deployments_using` scanned (and sorted) every ModelDeployment, and the RegionPool
handler built a view of the whole fleet to call it, on every pool spec change; spot sharing called
it per bounded spot region of every reconcile. Kopf now indexes each ModelDeployment's key under
the pools its spec names (`pool_index.pool_user_entries`), the operator's views read a pool's
users from it and the RegionPool handler reads the index without building a view.

Checked here: the index lists exactly what the old scan matched across creates, region edits,
deletions and a pool rename (with Kopf's index semantics applied by hand over seeded random
histories, and with the real Kopf against the API emulator); the callers (the handler, spot
sharing, views refreshed by a GET) answer as before; an indexed view reads no other record.
"""

from __future__ import annotations

import copy
import inspect
import random
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any, cast

import kopf
import pytest

import fleetwarden.operator.fleet as fleet
import fleetwarden.operator.runtime as runtime_module
from fleetwarden.api.v1alpha1 import RegionPoolSpec
from fleetwarden.operator.fleet import FleetView, ObjectRecord
from fleetwarden.operator.handlers import indices, regionpool
from fleetwarden.operator.kube import MODEL_DEPLOYMENTS, REGION_POOLS
from fleetwarden.operator.main import OperatorSettings
from fleetwarden.operator.reconcilers.context import Context
from fleetwarden.operator.runtime import Runtime
from fleetwarden.operator.spot_deployments import pool_spot_shares
from fleetwarden.operator.spot_signals import BacklogSignal
from tests.operator.fixtures import example
from tests.support.eventually import eventually
from tests.support.fleet_operator import RunningOperator, example_objects, running_operator
from tests.support.kube_emulator import KubeEmulator

NS = "llm-serving"
POOLS = ["p0", "p1", "p2", "p3"]
PLURALS = {
    "RegionPool": "regionpools",
    "ModelDeployment": "modeldeployments",
    "TenantPolicy": "tenantpolicies",
}


def _named(spec: Any) -> set[str]:
    """The pool names in a raw spec's regions, for the test's own bookkeeping."""
    regions = spec.get("regions") if isinstance(spec, Mapping) else None
    if not isinstance(regions, list):
        return set()
    return {r["pool"] for r in regions if isinstance(r, Mapping) and isinstance(r.get("pool"), str)}


def _index(runtime: Runtime) -> Mapping[str, Any]:
    """The pool-users index bound to `runtime` (looked up here: its id is part of the change)."""
    return runtime.indices[runtime_module.POOL_USERS_INDEX]


def _old_using(view: FleetView, pool: str) -> list[str]:
    """`FleetView.model_deployments_using` as it was (keys): every ModelDeployment scanned."""
    users = []
    for record in view.model_deployments.values():
        regions = record.spec.get("regions") or []
        if any(isinstance(r, Mapping) and r.get("pool") == pool for r in regions):
            users.append(record)
    return [r.key for r in sorted(users, key=lambda r: r.key)]


@cache
def _llama() -> dict[str, Any]:
    return example("ModelDeployment", "llama-3-70b")


def _md_body(name: str, regions: list[Any], generation: int = 1) -> dict[str, Any]:
    body = copy.deepcopy(_llama())
    body["metadata"].update(
        {"name": name, "uid": f"uid-{name}", "generation": generation},
        creationTimestamp="2026-01-01T00:00:00Z",
    )
    body["spec"]["model"]["servedName"] = name
    body["spec"]["regions"] = regions
    return body


def _regions(pools: list[str]) -> list[dict[str, Any]]:
    return [{"pool": p, "minInstances": 1, "maxInstances": 4} for p in pools]


def _pool_body(name: str) -> dict[str, Any]:
    body = example("RegionPool", "us-west-a100")
    body["metadata"] = {"name": name, "uid": f"uid-{name}", "generation": 1}
    return body


class Cluster:
    """Objects as the API server holds them, and the indices the operator's Kopf registry keeps
    of them, applied as Kopf applies them: on each event an object's values are replaced in
    every index of its kind at once, on deletion dropped from all."""

    def __init__(self) -> None:
        registry = kopf.OperatorRegistry()
        indices.register(registry)
        self.handlers = list(registry._indexing.get_all_handlers())
        self.values: dict[str, dict[tuple[str, str], dict[Any, Any]]] = {
            str(h.id): {} for h in self.handlers
        }
        self.bodies: dict[tuple[str, str], dict[str, Any]] = {}

    @staticmethod
    def _object(body: Mapping[str, Any]) -> tuple[str, str]:
        metadata = body["metadata"]
        return str(body["kind"]), f"{metadata.get('namespace')}/{metadata['name']}"

    async def apply(self, body: dict[str, Any]) -> None:
        obj = self._object(body)
        self.bodies[obj] = copy.deepcopy(body)
        for handler in self.handlers:
            if handler.selector is None or handler.selector.any_name != PLURALS[obj[0]]:
                continue
            result = cast(Any, handler.fn)(body=kopf.Body(copy.deepcopy(body)))
            if inspect.isawaitable(result):
                result = await result
            self.values[str(handler.id)][obj] = dict(result)

    def delete(self, body: Mapping[str, Any]) -> None:
        obj = self._object(body)
        self.bodies.pop(obj, None)
        for values in self.values.values():
            values.pop(obj, None)

    def indices(self) -> dict[str, dict[Any, list[Any]]]:
        """Each index as the handlers receive it: index key -> the values stored under it."""
        result: dict[str, dict[Any, list[Any]]] = {}
        for index_id, by_object in self.values.items():
            index: dict[Any, list[Any]] = {}
            for entries in by_object.values():
                for key, value in entries.items():
                    index.setdefault(key, []).append(value)
            result[index_id] = index
        return result

    def plain_view(self) -> FleetView:
        """The fleet as a hand-made view: no index, `model_deployments_using` scans it."""
        return FleetView.of(
            pools=[
                ObjectRecord.from_body(b) for (k, _), b in self.bodies.items() if k == "RegionPool"
            ],
            model_deployments=[
                ObjectRecord.from_body(b)
                for (k, _), b in self.bodies.items()
                if k == "ModelDeployment"
            ],
        )


def _runtime(cluster: Cluster) -> Runtime:
    context = Context(
        kube=cast(Any, None), events=cast(Any, None), sidecar_image="x", now=lambda: "t"
    )
    runtime = Runtime(context)
    runtime.indices = cluster.indices()
    return runtime


def assert_index_exact(cluster: Cluster, pools: set[str]) -> None:
    """The index lists, for every pool, exactly the users the old scan finds (no stale key, no
    empty entry), and the runtime and its views give the old scan's answer."""
    runtime = _runtime(cluster)
    plain = cluster.plain_view()
    named = {p for b in cluster.bodies.values() for p in _named(b.get("spec"))}
    expected = {p: _old_using(plain, p) for p in pools | named if _old_using(plain, p)}
    listed = _index(runtime)
    assert {p: sorted(keys) for p, keys in listed.items()} == expected
    view = runtime.view()
    for pool in pools | named | {"ghost"}:
        old = _old_using(plain, pool)
        assert runtime.pool_users(pool) == old, pool
        assert [r.key for r in view.model_deployments_using(pool)] == old, pool


def _random_regions(rng: random.Random, pools: list[str]) -> Any:
    draw = rng.random()
    if draw < 0.05:
        return "not a list"  # the CRD schema forbids it; the index must not fail on it
    regions: list[Any] = _regions(rng.sample(pools, rng.randrange(len(pools) + 1)))
    if draw < 0.15:
        regions += [{"pool": 7}, "not a region", {"minInstances": 1}]  # ignored, as by the scan
    return regions


@pytest.mark.parametrize("seed", range(20))
async def test_the_index_follows_creates_edits_deletes_and_pool_renames(seed: int) -> None:
    rng = random.Random(seed)
    cluster = Cluster()
    pools = list(POOLS)
    for pool in pools:
        await cluster.apply(_pool_body(pool))
    mds: dict[str, dict[str, Any]] = {}
    renamed = 0
    for step in range(60):
        draw = rng.random()
        if draw < 0.3 or not mds:  # create
            name = f"md-{step:02d}"
            mds[name] = _md_body(name, _random_regions(rng, pools))
            await cluster.apply(mds[name])
        elif draw < 0.55:  # its regions change
            body = mds[rng.choice(sorted(mds))]
            body["spec"]["regions"] = _random_regions(rng, pools)
            body["metadata"]["generation"] += 1
            await cluster.apply(body)
        elif draw < 0.65:  # a status write: nothing the index reads moves
            body = mds[rng.choice(sorted(mds))]
            body["status"] = {"regions": [{"pool": "elsewhere", "current": 1}]}
            await cluster.apply(body)
        elif draw < 0.85:  # deleted
            cluster.delete(mds.pop(rng.choice(sorted(mds))))
        else:  # a pool renamed: a new RegionPool, its users moved over, the old one deleted
            old = rng.choice(pools)
            new = f"renamed-{renamed}"
            renamed += 1
            await cluster.apply(_pool_body(new))
            for body in mds.values():
                regions = body["spec"]["regions"]
                if isinstance(regions, list) and old in _named(body["spec"]):
                    for region in regions:
                        if isinstance(region, dict) and region.get("pool") == old:
                            region["pool"] = new
                    body["metadata"]["generation"] += 1
                    await cluster.apply(body)
            cluster.delete(_pool_body(old))
            pools[pools.index(old)] = new
        assert_index_exact(cluster, set(POOLS) | set(pools))


# --- the callers ---------------------------------------------------------------------------


async def test_the_regionpool_handler_wakes_the_users_without_building_a_view() -> None:
    """A pool's spec change requests the ModelDeployments the old scan found, reading the index
    (the handler built a view of the whole fleet and scanned it); a status-only event none."""
    cluster = Cluster()
    await cluster.apply(_pool_body("p0"))
    for i in range(30):
        named = [pool for bit, pool in enumerate(POOLS) if i >> bit & 1]  # every subset
        await cluster.apply(_md_body(f"md-{i:02d}", _regions(named)))
    registry = kopf.OperatorRegistry()
    regionpool.register(registry)
    [handler] = registry._watching.get_all_handlers()
    runtime = Runtime(
        Context(kube=cast(Any, None), events=cast(Any, None), sidecar_image="x", now=lambda: "t")
    )
    requested: list[str] = []
    runtime.model_deployments.request = requested.append  # type: ignore[method-assign]
    runtime.pools.request = lambda key: None  # type: ignore[method-assign]

    def no_view() -> FleetView:
        raise AssertionError("the handler built a view of the fleet")

    runtime.view = no_view  # type: ignore[method-assign]
    memo = kopf.Memo()
    memo.runtime = runtime
    for pool in POOLS:
        body = _pool_body(pool)
        requested.clear()
        await cast(Any, handler.fn)(
            body=kopf.Body(body), type="MODIFIED", memo=memo, **cluster.indices()
        )
        assert requested == _old_using(cluster.plain_view(), pool), pool
        assert len(requested) > 0
        requested.clear()  # the same generation again: our own status write
        await cast(Any, handler.fn)(
            body=kopf.Body(body), type="MODIFIED", memo=memo, **cluster.indices()
        )
        assert requested == []


class _NoScan(dict[str, ObjectRecord]):
    """The fleet's records, failing any read of them all."""

    def values(self) -> Any:
        raise AssertionError("the fleet was scanned")

    def items(self) -> Any:
        raise AssertionError("the fleet was scanned")

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("the fleet was scanned")


async def test_an_indexed_view_reads_only_the_pool_users(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster()
    for i in range(200):
        await cluster.apply(_md_body(f"md-{i:03d}", _regions([POOLS[i % 4]])))
    runtime = _runtime(cluster)
    view = runtime.view()
    records = _NoScan(view.model_deployments)
    indexed = FleetView(model_deployments=records, pool_users=view.pool_users)
    read: list[str] = []
    original = fleet.named_pools

    def counting(record: ObjectRecord) -> frozenset[str]:
        read.append(record.key)
        return original(record)

    monkeypatch.setattr(fleet, "named_pools", counting)
    users = indexed.model_deployments_using("p1")
    assert [r.key for r in users] == [f"{NS}/md-{i:03d}" for i in range(1, 200, 4)]
    assert sorted(read) == [r.key for r in users]  # 50 records read, not 200


async def test_a_fresh_record_counts_under_the_pools_it_names_now() -> None:
    """A reconcile's view holds its own ModelDeployment as a GET just returned it, which the
    index (following watch events) may not have seen yet: a new one, or one whose regions moved.
    The view answers as the old scan of that view does."""
    cluster = Cluster()
    await cluster.apply(_md_body("moved", _regions(["p0", "p1"])))
    await cluster.apply(_md_body("other", _regions(["p1"])))
    view = _runtime(cluster).view()
    fresh_moved = ObjectRecord.from_body(_md_body("moved", _regions(["p1", "p2"]), generation=2))
    fresh_new = ObjectRecord.from_body(_md_body("new", _regions(["p2"])))
    indexed = view.with_fresh(fresh_moved).with_fresh(fresh_new)
    plain = cluster.plain_view().with_fresh(fresh_moved).with_fresh(fresh_new)
    assert indexed.pool_users is not None
    assert plain.pool_users is None
    for pool in [*POOLS, "ghost"]:
        assert [r.key for r in indexed.model_deployments_using(pool)] == _old_using(plain, pool)
    assert _old_using(plain, "p0") == []
    assert _old_using(plain, "p2") == [f"{NS}/moved", f"{NS}/new"]


@pytest.mark.parametrize("seed", range(10))
async def test_spot_shares_equal_those_of_the_scan(seed: int) -> None:
    """`pool_spot_shares` over an indexed view gives the shares it gave over the scanned view,
    bounded pool or not, fresh and stale backlog readings mixed."""
    rng = random.Random(seed)
    cluster = Cluster()
    for i in range(40):
        body = _md_body(f"md-{i:02d}", _regions(rng.sample(POOLS, rng.randrange(1, 4))))
        body["spec"]["niw"]["spot"]["enabled"] = rng.random() < 0.7
        body["status"] = {"regions": [{"pool": p, "spotReplicas": rng.randrange(3)} for p in POOLS]}
        await cluster.apply(body)
    indexed = _runtime(cluster).view()
    plain = cluster.plain_view()
    spec = RegionPoolSpec.model_validate(example("RegionPool", "us-west-a100")["spec"])
    readings = {
        f"md-{i:02d}": BacklogSignal(0.0, rng.randrange(30_000), ((600.0, 20_000),), 1024.0)
        for i in range(40)
        if rng.random() < 0.6
    }
    for bound in (None, 3, 12):
        pool = spec.model_copy(
            update={"spot": spec.spot.model_copy(update={"max_instances": bound})}
        )
        for name in POOLS:
            signals = lambda model, region: readings.get(model)  # noqa: E731
            old = pool_spot_shares(plain, name, pool, signals)
            assert pool_spot_shares(indexed, name, pool, signals) == old
            assert old  # each pool has spot users


# --- the real Kopf ---------------------------------------------------------------------------


def _in_sync(op: RunningOperator, pools: set[str]) -> bool:
    """The operator's records show what the API server holds, and its index agrees with them."""
    if not op.runtime.indices:  # bound on the first handler call
        return False
    view = op.runtime.view()
    served = {
        f"{NS}/{b['metadata']['name']}": b["spec"]["regions"]
        for b in op.list("ModelDeployment", NS)
    }
    if {k: r.spec.get("regions") for k, r in view.model_deployments.items()} != served:
        return False
    plain = FleetView.of(model_deployments=view.model_deployments.values())
    listed = _index(op.runtime)
    expected = {p: _old_using(plain, p) for p in pools if _old_using(plain, p)}
    return {p: sorted(set(listed[p])) for p in listed} == expected and all(
        op.runtime.pool_users(p) == _old_using(plain, p) for p in pools
    )


async def test_kopf_keeps_the_index_across_edits_deletes_and_a_pool_rename() -> None:
    """The operator against the API emulator: the index Kopf keeps matches the old scan of the
    operator's records after the example fleet is applied, a ModelDeployment is created, its
    regions are edited, it is deleted, and a pool is renamed (a new RegionPool, every user's
    region moved to it, the old one deleted)."""
    settings = OperatorSettings(peering_name=None, resync_seconds=3600)
    pools = {"us-east-a100", "us-west-a100", "eu-west-h100", "us-east-a100-v2", "ghost"}
    async with KubeEmulator() as emulator, running_operator(emulator, settings) as op:
        await op.apply(o for o in example_objects() if o["kind"] != "Namespace")
        await eventually(lambda: _in_sync(op, pools), timeout_s=20)
        assert op.runtime.pool_users("us-east-a100") == [f"{NS}/llama-3-70b", f"{NS}/mistral-7b"]

        extra = _md_body("extra", _regions(["us-east-a100", "us-west-a100"]))
        for field in ("uid", "generation", "creationTimestamp"):
            del extra["metadata"][field]
        await op.kube.create(extra)
        await eventually(lambda: f"{NS}/extra" in op.runtime.pool_users("us-west-a100"), 20)
        assert _in_sync(op, pools)

        await op.patch(extra, {"spec": {"regions": _regions(["eu-west-h100"])}})
        await eventually(lambda: f"{NS}/extra" in op.runtime.pool_users("eu-west-h100"), 20)
        assert _in_sync(op, pools)
        assert f"{NS}/extra" not in op.runtime.pool_users("us-west-a100")

        await op.kube.delete(MODEL_DEPLOYMENTS, "extra", NS)
        await eventually(lambda: f"{NS}/extra" not in op.runtime.pool_users("eu-west-h100"), 20)
        assert _in_sync(op, pools)

        renamed = example("RegionPool", "us-east-a100")
        renamed["metadata"]["name"] = "us-east-a100-v2"
        await op.kube.create(renamed)
        for body in op.list("ModelDeployment", NS):
            regions = body["spec"]["regions"]
            for region in regions:
                if region["pool"] == "us-east-a100":
                    region["pool"] = "us-east-a100-v2"
            await op.patch(body, {"spec": {"regions": regions}})
        await op.kube.delete(REGION_POOLS, "us-east-a100")
        await eventually(lambda: _in_sync(op, pools), timeout_s=20)
        assert op.runtime.pool_users("us-east-a100") == []
        assert op.runtime.pool_users("us-east-a100-v2") == [
            f"{NS}/llama-3-70b",
            f"{NS}/mistral-7b",
        ]
        await op.settle()
