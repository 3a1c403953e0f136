"""A broken or briefly missing object must not take serving capacity, config or GPUs away.

Each test runs the real operator against the API emulator and breaks one object the way a
GitOps re-sync or a bad edit would: a RegionPool that disappears or fails validation, a
TenantPolicy edit that passes the CRD schema but not the model, a ModelDeployment edit likewise.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from fleetwarden.operator.allocation import Demand
from fleetwarden.operator.fleet import FleetView, ObjectRecord, demands_of
from fleetwarden.operator.kube import MODEL_DEPLOYMENTS, REGION_POOLS
from fleetwarden.operator.runtime import rivals
from tests.operator.fixtures import record
from tests.operator.test_operator_e2e import (
    condition,
    example,
    fleet,
    op,
    served_name_canary,
)
from tests.support.fleet_operator import RunningOperator

NS = "llm-serving"
pytestmark = pytest.mark.timeout(120)
__all__ = ["fleet", "op"]  # fixtures, re-used from the main e2e module


async def _scale_by_decision(fleet: RunningOperator, pool: str, replicas: int) -> None:
    """Leave `replicas` as the operator's last decision for mistral-7b in `pool`, as the scaler
    or an hourly plan would, and let the Deployment follow it."""
    md = fleet.get("ModelDeployment", "mistral-7b", NS)
    assert md is not None
    regions = md["status"]["regions"]
    for region in regions:
        if region["pool"] == pool:
            region["current"] = replicas
    body = {"status": {"regions": regions}}
    await fleet.kube.merge_patch(MODEL_DEPLOYMENTS, "mistral-7b", body, NS, "status")
    await fleet.settle()
    assert _replicas(fleet, "mistral-7b-us-east-a100") == replicas


def _replicas(fleet: RunningOperator, deployment: str) -> int:
    live = fleet.get("Deployment", deployment, NS)
    assert live is not None
    return int(live["spec"]["replicas"])


def _region(fleet: RunningOperator, pool: str) -> dict[str, Any]:
    md = fleet.get("ModelDeployment", "mistral-7b", NS)
    assert md is not None
    return next(r for r in md["status"]["regions"] if r["pool"] == pool)


async def test_a_pool_that_goes_missing_and_returns_scales_nothing(fleet: RunningOperator) -> None:
    await _scale_by_decision(fleet, "us-east-a100", 6)
    pool = example("RegionPool", "us-east-a100")
    await fleet.kube.delete(REGION_POOLS, "us-east-a100")
    await fleet.settle(quiet_s=1.0)
    assert condition(fleet.get("ModelDeployment", "mistral-7b", NS), "Degraded")["reason"] == (
        "PoolNotFound"
    )
    assert _region(fleet, "us-east-a100")["current"] == 6  # not 0: the children still run
    assert _replicas(fleet, "mistral-7b-us-east-a100") == 6

    await fleet.apply([pool])
    await fleet.settle(quiet_s=1.0)
    assert _replicas(fleet, "mistral-7b-us-east-a100") == 6  # not clamped back to minInstances
    assert condition(fleet.get("ModelDeployment", "mistral-7b", NS), "Degraded")["status"] == (
        "False"
    )


async def test_a_pool_that_turns_invalid_and_is_fixed_scales_nothing(
    fleet: RunningOperator,
) -> None:
    await _scale_by_decision(fleet, "us-east-a100", 6)
    pool = example("RegionPool", "us-east-a100")
    capacity = pool["spec"]["capacity"]
    await fleet.patch(pool, {"spec": {"capacity": {"gpus": None, "instances": None}}})
    await fleet.settle(quiet_s=1.0)
    assert condition(fleet.get("ModelDeployment", "mistral-7b", NS), "Degraded")["reason"] == (
        "PoolInvalid"
    )
    assert _region(fleet, "us-east-a100")["current"] == 6

    await fleet.patch(pool, {"spec": {"capacity": capacity}})
    await fleet.settle(quiet_s=1.0)
    assert _replicas(fleet, "mistral-7b-us-east-a100") == 6


def _fairness(fleet: RunningOperator) -> dict[str, Any]:
    config_map = fleet.get("ConfigMap", "llama-3-70b-us-east-a100-fairness", NS)
    assert config_map is not None
    document: dict[str, Any] = json.loads(config_map["data"]["fairness.json"])
    return document


async def test_an_invalid_tenant_policy_edit_keeps_the_applied_config(
    fleet: RunningOperator,
) -> None:
    before = _fairness(fleet)
    assert before["source"] == f"TenantPolicy {NS}/enterprise"
    policy = example("TenantPolicy", "enterprise")
    await fleet.patch(policy, {"spec": {"drr": {"quantum": {"iwf": 100}}}})  # schema-valid
    await fleet.settle(quiet_s=1.0)

    assert _fairness(fleet) == before  # not switched to the defaults
    md = fleet.get("ModelDeployment", "llama-3-70b", NS)
    degraded = condition(md, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "TenantPolicyInvalid")
    assert "TenantPolicy enterprise" in degraded["message"]
    assert "applied last is kept" in degraded["message"]
    assert md is not None
    assert md["status"]["tenantPolicy"] == "enterprise"
    warnings = [e["reason"] for e in fleet.events_for("llama-3-70b", NS) if e["type"] == "Warning"]
    assert "TenantPolicyInvalid" in warnings

    # Fixing the policy brings the ModelDeployment back without anyone touching it.
    await fleet.patch(policy, {"spec": {"drr": None}})
    await fleet.settle(quiet_s=1.0)
    md = fleet.get("ModelDeployment", "llama-3-70b", NS)
    assert condition(md, "Degraded")["status"] == "False"
    assert _fairness(fleet)["source"] == f"TenantPolicy {NS}/enterprise"


async def test_an_invalid_model_deployment_keeps_its_gpus_allocated(
    fleet: RunningOperator,
) -> None:
    def allocations() -> dict[str, int]:
        pool = fleet.get("RegionPool", "us-east-a100")
        assert pool is not None
        return {a["modelDeployment"]: a["gpus"] for a in pool["status"]["allocations"]}

    before = allocations()
    assert before[f"{NS}/llama-3-70b"] > 0
    llama = example("ModelDeployment", "llama-3-70b")
    regions = llama["spec"]["regions"]
    regions[0]["minInstances"] = regions[0]["maxInstances"] + 1  # fails the model, not the CRD
    await fleet.patch(llama, {"spec": {"regions": regions}})
    await fleet.settle(quiet_s=1.0)

    md = fleet.get("ModelDeployment", "llama-3-70b", NS)
    assert condition(md, "Degraded")["reason"] == "InvalidSpec"
    assert fleet.get("Deployment", "llama-3-70b-us-east-a100", NS) is not None  # still running
    assert allocations() == before  # so its GPUs stay allocated


def test_an_invalid_model_deployment_holds_what_its_status_says_runs() -> None:
    """GPUs per instance from the raw spec (the CRD keeps it valid), regions from status."""
    llama = example("ModelDeployment", "llama-3-70b")
    llama["spec"]["regions"][0]["minInstances"] = 99
    status = {"regions": [{"pool": "us-east-a100", "current": 3}, {"pool": "gone", "current": 0}]}
    broken = record(llama, status=status)
    gpus = llama["spec"]["model"]["gpusPerInstance"]
    assert demands_of(broken) == (
        Demand(f"{NS}/llama-3-70b", broken.created, "us-east-a100", 3, gpus),
    )
    assert demands_of(record(llama)) == ()  # never reconciled: nothing runs, nothing held


def test_an_invalid_policy_selects_by_its_raw_selector() -> None:
    """A bad quantum must not make the policy select nothing; a bad selector selects all."""
    policy = example("TenantPolicy", "enterprise")
    policy["spec"]["drr"] = {"quantum": {"iwf": 100}}
    policy["spec"]["selector"] = {"matchLabels": {"team": "a"}}
    view = FleetView.of(tenant_policies=[record(policy)])

    def selected(labels: dict[str, str]) -> bool:
        (ref,) = view.policy_refs(NS, labels)
        assert ref.spec is None
        assert ref.error is not None
        return ref.labels_selected

    assert selected({"team": "a"})
    assert not selected({"team": "b"})
    policy["spec"]["selector"] = {"matchExpressions": [{"key": "team", "operator": "Near"}]}
    view = FleetView.of(tenant_policies=[record(policy)])
    assert selected({"team": "b"})


async def test_a_served_name_conflict_clears_when_the_older_one_is_deleted(
    op: RunningOperator,
) -> None:
    await served_name_canary(op)
    degraded = condition(op.get("ModelDeployment", "llama-3-70b-canary", NS), "Degraded")
    assert degraded["reason"] == "ServedNameConflict"

    await op.kube.delete(MODEL_DEPLOYMENTS, "llama-3-70b", NS)
    await op.settle(quiet_s=1.0)  # no resync in between: the deletion itself must wake it
    degraded = condition(op.get("ModelDeployment", "llama-3-70b-canary", NS), "Degraded")
    assert degraded["status"] == "False"


async def test_a_capacity_shortfall_clears_when_the_older_one_moves_away(
    op: RunningOperator,
) -> None:
    pool = example("RegionPool", "us-east-a100")
    pool["spec"]["capacity"] = {"gpus": 8}
    first = example("ModelDeployment", "llama-3-70b")
    first["spec"]["regions"] = [{"pool": "us-east-a100", "minInstances": 2, "maxInstances": 4}]
    await op.apply([pool, example("RegionPool", "us-west-a100"), first])
    await op.settle()
    second = example("ModelDeployment", "mistral-7b")
    second["spec"]["regions"] = [{"pool": "us-east-a100", "minInstances": 1, "maxInstances": 4}]
    await op.apply([second])
    await op.settle()
    degraded = condition(op.get("ModelDeployment", "mistral-7b", NS), "Degraded")
    assert degraded["reason"] == "InsufficientPoolCapacity"

    first["spec"]["regions"] = [{"pool": "us-west-a100", "minInstances": 2, "maxInstances": 4}]
    await op.patch(first, {"spec": {"regions": first["spec"]["regions"]}})
    await op.settle(quiet_s=1.0)
    degraded = condition(op.get("ModelDeployment", "mistral-7b", NS), "Degraded")
    assert degraded["status"] == "False"


def test_rivals_are_younger_name_sharers_and_degraded_pool_sharers_only() -> None:
    """Whom a change of the oldest ModelDeployment wakes: every younger one sharing its served
    name, younger pool sharers only while Degraded (a healthy one waits for the resync, or a
    fleet-wide edit would wake each sharer once per older sharer), never an older one."""
    base = example("ModelDeployment", "llama-3-70b")
    pool = base["spec"]["regions"][0]["pool"]
    degraded = {"conditions": [{"type": "Degraded", "status": "True", "reason": "X"}]}
    healthy = {"conditions": [{"type": "Degraded", "status": "False", "reason": "AsExpected"}]}

    def named(name: str, minute: int, status: dict[str, Any]) -> ObjectRecord:
        body = copy.deepcopy(base)
        body["metadata"]["name"] = name
        return record(body, created=f"2026-01-01T00:{minute:02d}:00Z", status=status)

    changed = named("changed", 10, healthy)
    older = named("older", 0, degraded)
    short = named("short", 20, degraded)
    fine = named("fine", 30, healthy)
    namesake = named("namesake", 40, healthy)
    view = FleetView.of(model_deployments=[changed, older, short, fine, namesake])
    woken = rivals(view, changed, [pool], {namesake.key, older.key, changed.key})
    assert woken == {short.key, namesake.key}
