"""Parsed specs are kept per object: an unchanged object is validated once, a changed one again.

Every reconcile reads every ModelDeployment's spec (pool accounting, served-name conflicts), so
without the cache a whole-fleet change costs fleet x fleet validations. Real parses are counted by
wrapping `fleet._parse` (what the cache calls on a miss), never timed.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest

import fleetwarden.operator.fleet as fleet
from fleetwarden.api.v1alpha1 import ModelDeploymentSpec, RegionPoolSpec
from fleetwarden.operator import conditions
from fleetwarden.operator.allocation import account
from fleetwarden.operator.fleet import (
    MODEL_DEPLOYMENT_SPECS,
    POOL_SPECS,
    TENANT_POLICY_SPECS,
    FleetView,
    ObjectRecord,
    forget_parsed,
    parse_model_deployment,
    retain_parsed,
)
from fleetwarden.operator.kube import MODEL_DEPLOYMENTS, TENANT_POLICIES, ResourceKind
from fleetwarden.operator.reconcilers.context import Context
from fleetwarden.operator.reconcilers.regionpool import reconcile_region_pool
from fleetwarden.operator.served_names import served_name_conflicts
from fleetwarden.operator.spec_cache import SpecCache
from tests.operator.fixtures import example, example_objects, example_view, record
from tests.support.fleet_operator import running_operator
from tests.support.kube_emulator import KubeEmulator

NS = "llm-serving"
FLEET = 200
ROUNDS = 10
ORIGINAL_PARSE = fleet._parse


@pytest.fixture(autouse=True)
def empty_caches() -> Iterator[None]:
    """Each test counts its own parses; other tests' slots would turn its misses into hits."""
    for cache in (MODEL_DEPLOYMENT_SPECS, POOL_SPECS, TENANT_POLICY_SPECS):
        cache.clear()
    yield
    for cache in (MODEL_DEPLOYMENT_SPECS, POOL_SPECS, TENANT_POLICY_SPECS):
        cache.clear()


@dataclass
class Parses:
    """Real (uncached) parses: (spec model name, the raw spec parsed), in call order."""

    calls: list[tuple[str, Any]] = field(default_factory=list)

    def __getitem__(self, model: str) -> int:
        return sum(1 for name, _ in self.calls if name == model)

    def clear(self) -> None:
        self.calls.clear()


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Parses:
    counted = Parses()

    def counting(model: type[Any], raw: Any) -> Any:
        counted.calls.append((model.__name__, copy.deepcopy(raw)))
        return ORIGINAL_PARSE(model, raw)

    monkeypatch.setattr(fleet, "_parse", counting)
    return counted


@dataclass
class StatusSink:
    """Stands in for the API client: keeps every status patch, in order."""

    patches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def patch_status(
        self, kind: ResourceKind, name: str, status: dict[str, Any], namespace: str | None = None
    ) -> None:
        self.patches.append((name, copy.deepcopy(status)))


class NoEvents:
    def post(self, obj: ObjectRecord, type_: str, reason: str, message: str) -> None:
        pass


def _context(sink: StatusSink) -> Context:
    return Context(
        kube=cast(Any, sink), events=NoEvents(), sidecar_image="x", now=lambda: "2026-01-01T00:00Z"
    )


@functools.cache
def _llama() -> dict[str, Any]:
    return example("ModelDeployment", "llama-3-70b")  # reads every example file: keep it


def _md(index: int, **changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(_llama())
    body["metadata"]["name"] = f"md-{index:04d}"
    body["spec"]["model"]["servedName"] = f"served-{index}"
    body["spec"]["regions"][0].update(changes)
    return body


def _refetched(obj: ObjectRecord) -> ObjectRecord:
    """The same object as a fresh GET returns it: equal content, new dicts."""
    return replace(obj, spec=copy.deepcopy(obj.spec), status=copy.deepcopy(obj.status))


def _fleet() -> FleetView:
    pools = [record(o) for o in example_objects() if o["kind"] == "RegionPool"]
    return FleetView.of(pools, [record(_md(i)) for i in range(FLEET)])


async def test_an_unchanged_fleet_is_parsed_once_across_many_reconciles(
    parses: Parses,
) -> None:
    view = _fleet()
    sink = StatusSink()
    ctx = _context(sink)
    md_keys = sorted(view.model_deployments)[::20]
    shortfalls: list[list[str]] = []
    for _ in range(ROUNDS):
        for name in sorted(view.pools):  # RegionPool reconciles: allocation over the whole fleet
            await reconcile_region_pool(ctx, view.with_fresh(_refetched(view.pools[name])), name)
        for key in md_keys:  # the fleet-wide part of a ModelDeployment reconcile
            own = _refetched(view.model_deployments[key])
            fresh = view.with_fresh(own)
            spec = parse_model_deployment(own).spec
            assert spec is not None
            accounting = account(fresh.valid_pools(), fresh.demands())
            shortfalls.append([s.message for s in accounting.shortfalls_of(key)])
            assert served_name_conflicts(fresh, own, spec) == []

    assert parses["ModelDeploymentSpec"] == FLEET  # was ROUNDS x (pools + md_keys) x FLEET
    assert parses["RegionPoolSpec"] == len(view.pools)
    per_round = len(sink.patches) // ROUNDS
    assert sink.patches[:per_round] == sink.patches[-per_round:]  # every round saw the same
    assert shortfalls[: len(md_keys)] == shortfalls[-len(md_keys) :]
    east = dict(sink.patches)["us-east-a100"]
    assert len(east["allocations"]) == FLEET
    for cache in (MODEL_DEPLOYMENT_SPECS, POOL_SPECS):
        cache.clear()
    uncached = account(view.valid_pools(), view.demands())
    assert east["allocatedGpus"] == uncached.usage["us-east-a100"].gpus


def test_a_new_generation_is_parsed_again(parses: Parses) -> None:
    first = record(_md(0), generation=1)
    second = record(_md(0, minInstances=3), generation=2)
    for _ in range(3):
        spec = parse_model_deployment(first).spec
        assert spec is not None
        assert spec.regions[0].min_instances == 2
    assert parses["ModelDeploymentSpec"] == 1
    for _ in range(3):
        spec = parse_model_deployment(second).spec
        assert spec is not None
        assert spec.regions[0].min_instances == 3
    assert parses["ModelDeploymentSpec"] == 2
    # A view built from an index that has not caught up yet still gets the old spec's parse.
    spec = parse_model_deployment(first).spec
    assert spec is not None
    assert spec.regions[0].min_instances == 2
    assert parses["ModelDeploymentSpec"] == 3
    # The generation is part of the key: a new one is parsed again even if the spec reads the same
    # (the API server only bumps it on a spec change, so this costs one parse, rarely).
    third = record(_md(0), generation=3)
    spec = parse_model_deployment(third).spec
    assert parses["ModelDeploymentSpec"] == 4
    assert spec is not None
    assert spec.regions[0].min_instances == 2
    assert len(MODEL_DEPLOYMENT_SPECS) == 1  # one slot per object, not one per generation


def test_a_changed_spec_without_a_new_generation_is_parsed_again(parses: Parses) -> None:
    """CRD defaults are applied on read (a CRD upgrade changes specs, not generations), and
    hand-made records all say generation 1: the spec itself is what must match."""
    before = record(_md(0), generation=7)
    after = record(_md(0, maxInstances=20), generation=7)
    assert after.generation == before.generation
    assert after.uid == before.uid
    spec = parse_model_deployment(before).spec
    assert spec is not None
    assert spec.regions[0].max_instances == 12
    spec = parse_model_deployment(after).spec
    assert spec is not None
    assert spec.regions[0].max_instances == 20
    assert parses["ModelDeploymentSpec"] == 2


def test_a_recreated_object_is_parsed_again_in_the_same_slot(parses: Parses) -> None:
    for uid in ("uid-a", "uid-b", "uid-a"):
        assert parse_model_deployment(record(_md(0), uid=uid)).spec is not None
    assert parses["ModelDeploymentSpec"] == 3
    assert len(MODEL_DEPLOYMENT_SPECS) == 1


def test_labels_are_not_read_by_the_parse_so_a_relabel_costs_none(parses: Parses) -> None:
    """Labels do not bump the generation and the parse does not read them; policy selection,
    which does, reads them from the record on every call."""
    view = example_view()
    llama = view.model_deployments[f"{NS}/llama-3-70b"]
    relabeled = replace(llama, labels={"fleetwarden.dev/fairness": "agents"})

    def selected(obj: ObjectRecord) -> list[str]:
        assert parse_model_deployment(obj).spec is not None
        refs = view.policy_refs(obj.namespace, obj.labels)
        return sorted(r.name for r in refs if r.labels_selected)

    assert selected(llama) == ["enterprise"]
    assert selected(relabeled) == ["agents"]
    assert selected(llama) == ["enterprise"]
    assert parses["ModelDeploymentSpec"] == 1
    assert parses["TenantPolicySpec"] == len(view.tenant_policies)


async def test_an_invalid_spec_keeps_giving_the_same_error(parses: Parses) -> None:
    bad = _md(0, minInstances=5, maxInstances=2)
    expected = ORIGINAL_PARSE(ModelDeploymentSpec, bad["spec"])
    assert expected.spec is None
    assert expected.error is not None
    assert "minInstances must be <= maxInstances" in expected.error
    broken = record(bad, generation=1)
    for _ in range(5):
        assert parse_model_deployment(broken) == expected
    assert parses["ModelDeploymentSpec"] == 1
    fixed = record(_md(0), generation=2)
    assert parse_model_deployment(fixed).spec is not None
    assert parse_model_deployment(record(bad, generation=3)) == expected
    view = FleetView.of(model_deployments=[record(bad, generation=3)])
    assert view.demands() == []  # an invalid ModelDeployment still holds nothing

    # An invalid pool: the reconciler writes InvalidSpec with the same message every pass.
    pool = example("RegionPool", "us-east-a100")
    pool["spec"]["capacity"] = "not a capacity"
    pool_error = ORIGINAL_PARSE(RegionPoolSpec, pool["spec"]).error
    assert pool_error is not None
    pools = FleetView.of(pools=[record(pool)])
    sink = StatusSink()
    for _ in range(3):
        await reconcile_region_pool(_context(sink), pools, "us-east-a100")
    assert parses["RegionPoolSpec"] == 1
    for _, status in sink.patches:
        by_type = {c["type"]: c for c in status["conditions"]}
        assert by_type[conditions.DEGRADED]["reason"] == conditions.INVALID_SPEC
        assert by_type[conditions.DEGRADED]["message"] == pool_error


def test_deleted_and_recreated_objects_do_not_pile_up(
    parses: Parses, monkeypatch: pytest.MonkeyPatch
) -> None:
    for index in range(1_000):  # created and deleted: evicted on the DELETED event
        obj = record(_md(index))
        parse_model_deployment(obj)
        forget_parsed(obj)
    assert len(MODEL_DEPLOYMENT_SPECS) == 0
    for index in range(1_000):  # re-created under one name: its slot is replaced
        parse_model_deployment(record(_md(0), uid=f"uid-{index}"))
    assert len(MODEL_DEPLOYMENT_SPECS) == 1
    for index in range(1, 300):  # deleted while the watch was down: the resync drops them
        parse_model_deployment(record(_md(index)))
    assert len(MODEL_DEPLOYMENT_SPECS) == 300
    retain_parsed(FleetView.of(model_deployments=[record(_md(0))]))
    assert len(MODEL_DEPLOYMENT_SPECS) == 1
    assert (NS, "md-0000") in MODEL_DEPLOYMENT_SPECS
    monkeypatch.setattr(MODEL_DEPLOYMENT_SPECS, "max_entries", 50)  # and never past the cap
    for index in range(2_000):
        parse_model_deployment(record(_md(index)))
    assert len(MODEL_DEPLOYMENT_SPECS) == 50


def test_the_least_recently_used_slot_goes_first() -> None:
    cache: SpecCache[str] = SpecCache(max_entries=2)
    objects = {n: record(_md(n)) for n in range(3)}

    def parse(raw: Any) -> str:
        return str(raw["model"]["servedName"])

    for n in (0, 1, 0, 2):
        assert cache.get(objects[n], parse) == f"served-{n}"
    assert (NS, "md-0000") in cache
    assert (NS, "md-0002") in cache
    assert (NS, "md-0001") not in cache
    with pytest.raises(ValueError, match="at least 1"):
        SpecCache[str](max_entries=0)


@pytest.mark.timeout(120)
async def test_the_running_operator_reparses_only_what_changed(parses: Parses) -> None:
    async with KubeEmulator() as emulator, running_operator(emulator) as op:
        await op.apply(o for o in example_objects() if o["kind"] != "Namespace")
        await op.settle()
        parse_model_deployment(record(_md(9)))  # as if its DELETED event had been missed
        assert (NS, "md-0009") in MODEL_DEPLOYMENT_SPECS
        parses.clear()
        for _ in range(3):  # resyncs: every object reconciled, every spec read again
            op.runtime.request_all()
            await op.settle()
        assert parses.calls == []
        assert (NS, "md-0009") not in MODEL_DEPLOYMENT_SPECS  # the resync dropped it

        mistral = example("ModelDeployment", "mistral-7b")
        regions = copy.deepcopy(mistral["spec"]["regions"])
        regions[0]["minInstances"] = 3
        await op.patch(mistral, {"spec": {"regions": regions}})
        await op.settle()
        assert parses.calls  # the changed object, once per index lag at most; nothing else
        assert all(
            model == "ModelDeploymentSpec" and raw["model"]["servedName"] == "mistral-7b"
            for model, raw in parses.calls
        ), [(model, raw.get("model")) for model, raw in parses.calls]
        deployment = op.get("Deployment", "mistral-7b-us-east-a100", NS)
        assert deployment is not None
        assert deployment["spec"]["replicas"] == 3

        await op.kube.delete(MODEL_DEPLOYMENTS, "mistral-7b", NS)
        await op.settle()
        assert (NS, "mistral-7b") not in MODEL_DEPLOYMENT_SPECS
        assert (NS, "llama-3-70b") in MODEL_DEPLOYMENT_SPECS
        assert (NS, "agents") in TENANT_POLICY_SPECS
        await op.kube.delete(TENANT_POLICIES, "agents", NS)
        await op.settle()
        assert (NS, "agents") not in TENANT_POLICY_SPECS
        assert (NS, "enterprise") in TENANT_POLICY_SPECS
