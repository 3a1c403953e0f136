"""What the runtime keeps about a ModelDeployment goes when it does, or when one of its regions does.

A missed DELETE event (a watch that restarted) left its footprint, served name, winning policy,
the pusher's desired config and pods, the autoscaler's signals, plans and scalers and the plan
book's records in memory for the operator's life: the periodic resync pruned only the parsed
specs. And a region removed from a live spec kept its scaling state and plan records.
"""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest

import fleetwarden.operator.runtime as runtime_module
from fleetwarden.operator.autoscaler import Autoscaler, RegionPlan, RegionSignal
from fleetwarden.operator.config_push import DesiredConfig, PodTarget
from fleetwarden.operator.fleet import FleetView, ObjectRecord, parse_model_deployment
from fleetwarden.operator.kube import ResourceKind
from fleetwarden.operator.plan_status import EndpointRecord, PlanBook, PlanHealth
from fleetwarden.operator.reconcilers.context import Context
from fleetwarden.operator.runtime import Footprint, Runtime
from tests.operator.fixtures import example, record

NS = "llm-serving"
EAST, WEST, EU = "us-east-a100", "us-west-a100", "eu-west-h100"


def _md(name: str, pools: list[str], generation: int = 1) -> ObjectRecord:
    body = copy.deepcopy(example("ModelDeployment", "llama-3-70b"))
    body["metadata"].update({"name": name, "namespace": NS})
    body["spec"]["regions"] = [{"pool": p, "minInstances": 1, "maxInstances": 4} for p in pools]
    return record(body, generation=generation)


def _endpoint() -> EndpointRecord:
    return EndpointRecord("r", 1, 2, 10.0, "arima", True, None, False, 0.0, 0.0)


def _runtime(monkeypatch: pytest.MonkeyPatch, view: list[FleetView]) -> Runtime:
    """A runtime whose requests go nowhere and whose reconciles see `view[0]` (no API)."""
    context = Context(
        kube=cast(Any, None),
        events=cast(Any, None),
        sidecar_image="x",
        now=lambda: "t",
        autoscaler=Autoscaler(),
        plans=PlanBook(),
    )
    runtime = Runtime(context)
    for coalescer in (runtime.model_deployments, runtime.pools, runtime.policies):
        coalescer.request = lambda key: None  # type: ignore[method-assign]
    runtime.view = lambda: view[0]  # type: ignore[method-assign]

    async def fresh_view(kind: ResourceKind, key: str) -> FleetView:
        return view[0]

    async def no_reconcile(*args: object) -> None:
        return None

    runtime.fresh_view = fresh_view  # type: ignore[method-assign]
    monkeypatch.setattr(runtime_module, "reconcile_model_deployment", no_reconcile)
    return runtime


def _remember(runtime: Runtime, key: str, pools: list[str]) -> None:
    """State as reconciles, the pusher, the poller and the planner leave it for `key`."""
    runtime.footprints[key] = Footprint((), ())
    runtime.served_as[key] = f"served-{key}"
    runtime.policy_of[key] = f"{NS}/gold"
    pusher = runtime.context.pusher
    pusher.set_desired(key, DesiredConfig("v1", "{}", "token"))
    pusher.sync_pods(key, [])
    pusher._observe(PodTarget(f"{key}-pod", key, None, False))  # a pod not ready yet
    scaler = runtime.context.autoscaler
    book = runtime.context.plans
    assert scaler is not None
    assert book is not None
    scaler.missing[key] = ["r"]
    scaler.missing_load[key] = ["r"]
    spec = parse_model_deployment(_md("any", pools)).spec
    assert spec is not None
    for placement in spec.regions:
        scaler.signals[(key, placement.pool)] = RegionSignal(0.0, 0.9, 10.0)
        scaler.plans[(key, placement.pool)] = RegionPlan(2, 10.0)
        scaler.step(key, spec, placement, 1, 1.0)  # creates its scaler
        book.endpoints[(key, placement.pool)] = _endpoint()
    book.health[key] = PlanHealth(True, "Planned", "")


def _held(runtime: Runtime, key: str) -> dict[str, bool]:
    pusher, scaler, book = runtime.context.pusher, runtime.context.autoscaler, runtime.context.plans
    assert scaler is not None
    assert book is not None
    return {
        "footprint": key in runtime.footprints,
        "served_as": key in runtime.served_as,
        "policy_of": key in runtime.policy_of,
        "desired": key in pusher.desired,
        "pods": any(p.model_deployment == key for p in pusher.pods.values()),
        "label": pusher.model_deployment_of(NS, key.rpartition("/")[2]) is not None,
        "signals": any(k[0] == key for k in scaler.signals),
        "plans": any(k[0] == key for k in scaler.plans),
        "scalers": any(k[0] == key for k in scaler._scalers),
        "missing": key in scaler.missing or key in scaler.missing_load,
        "endpoints": any(k[0] == key for k in book.endpoints),
        "health": key in book.health,
    }


def test_the_resync_forgets_model_deployments_whose_delete_was_missed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live, gone = _md("live", [EAST, WEST]), _md("gone", [EAST, WEST])
    view = [FleetView.of(model_deployments=[live, gone])]
    runtime = _runtime(monkeypatch, view)
    for md in (live, gone):
        _remember(runtime, md.key, [EAST, WEST])
    assert all(_held(runtime, gone.key).values())

    view[0] = FleetView.of(model_deployments=[live])  # its DELETE event never came
    runtime.request_all()
    assert not any(_held(runtime, gone.key).values()), _held(runtime, gone.key)
    assert all(_held(runtime, live.key).values()), _held(runtime, live.key)


def test_forget_regions_keeps_the_pools_still_named() -> None:
    scaler, book = Autoscaler(), PlanBook()
    spec = parse_model_deployment(_md("a", [EAST, WEST])).spec
    assert spec is not None
    for key in ("ns/a", "ns/b"):
        for placement in spec.regions:
            scaler.signals[(key, placement.pool)] = RegionSignal(0.0, 0.9, 10.0)
            scaler.plans[(key, placement.pool)] = RegionPlan(2, 10.0)
            scaler.step(key, spec, placement, 1, 1.0)
            book.endpoints[(key, placement.pool)] = _endpoint()
        book.health[key] = PlanHealth(True, "Planned", "")
    scaler.forget_regions("ns/a", {EAST})
    book.forget_regions("ns/a", {EAST})
    for store in (scaler.signals, scaler.plans, scaler._scalers, book.endpoints):
        assert sorted(store) == [("ns/a", EAST), ("ns/b", EAST), ("ns/b", WEST)]
    assert set(book.health) == {"ns/a", "ns/b"}


async def test_a_region_removed_from_the_spec_loses_its_scaling_state_and_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reconcile of the new generation drops the removed pool's entries, keeps the others;
    an invalid spec (its children keep running) forgets nothing."""
    before = _md("llama", [EAST, WEST, EU])
    view = [FleetView.of(model_deployments=[before])]
    runtime = _runtime(monkeypatch, view)
    await runtime._reconcile_model_deployment(before.key)
    _remember(runtime, before.key, [EAST, WEST, EU])
    scaler, book = runtime.context.autoscaler, runtime.context.plans
    assert scaler is not None
    assert book is not None

    invalid = copy.deepcopy(_md("llama", [EAST], generation=2))
    body = {
        "metadata": {"name": "llama", "namespace": NS, "generation": 2},
        "spec": {**invalid.spec, "regions": [{"pool": EAST, "minInstances": 9, "maxInstances": 1}]},
        "kind": "ModelDeployment",
    }
    view[0] = FleetView.of(model_deployments=[ObjectRecord.from_body(body)])
    await runtime._reconcile_model_deployment(before.key)
    assert {k[1] for k in scaler._scalers} == {EAST, WEST, EU}

    view[0] = FleetView.of(model_deployments=[_md("llama", [EAST, EU], generation=3)])
    await runtime._reconcile_model_deployment(before.key)
    for store in (scaler.signals, scaler.plans, scaler._scalers, book.endpoints):
        assert {pool for _, pool in store} == {EAST, EU}
