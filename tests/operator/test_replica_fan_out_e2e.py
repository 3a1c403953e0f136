"""A scaling step of an older ModelDeployment reaches its pools and the younger ones it left short.

Pool accounting counts each ModelDeployment's replicas from `status.regions[].current`, which the
reconcile writes after a scaling step (the scaler acting on a signal or an hourly plan). The
generation does not move, so before the fix nothing but the periodic resync (an hour here)
re-reconciled the pool or a younger ModelDeployment short of capacity in it.

Real: Kopf, the operator, its reconcilers and scalers. Mocked: the cluster (the API emulator), and
Prometheus: the test fills the autoscaler's signals and plans and asks for a reconcile, which is
all the metrics poller and the hourly planner do, with a clock of its own so cooldowns are exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleetwarden.operator.autoscaler import Autoscaler, RegionPlan, RegionSignal
from fleetwarden.operator.kube import DEPLOYMENTS
from tests.operator.test_operator_e2e import condition, example
from tests.support.fleet_operator import RunningOperator, running_operator
from tests.support.kube_emulator import KubeEmulator

NS = "llm-serving"
POOL = "us-east-a100"
OLDER, YOUNGER = "llama-3-70b", "mistral-7b"  # same second: the key breaks the tie, llama first
pytestmark = pytest.mark.timeout(120)


@dataclasses.dataclass
class Scaling:
    """The operator's autoscaler, driven by hand, and the clock its reconciles read."""

    op: RunningOperator
    autoscaler: Autoscaler
    now_s: float = 1_000_000.0

    async def plan(self, name: str, target: int) -> None:
        """What a poll plus an hourly plan leave behind: a fresh signal, a target, a reconcile
        request. The lt-i scaler then takes one step toward the target."""
        self.now_s += 60.0  # past any cooldown
        key = (f"{NS}/{name}", POOL)
        self.autoscaler.plans[key] = RegionPlan(target=target, forecast_peak_tps=None)
        self.autoscaler.signals[key] = RegionSignal(self.now_s, utilisation=0.5, load_tps=None)
        self.op.runtime.model_deployments.request(f"{NS}/{name}")
        await self.op.settle(quiet_s=1.0)  # a short wait: the resync is an hour away


@pytest.fixture
async def scaling() -> AsyncIterator[Scaling]:
    async with KubeEmulator() as emulator, running_operator(emulator) as op:
        runtime = op.runtime
        scaling = Scaling(op, Autoscaler())
        runtime.context = dataclasses.replace(
            runtime.context, autoscaler=scaling.autoscaler, clock=lambda: scaling.now_s
        )
        yield scaling


def _model_deployment(name: str, max_instances: int) -> dict[str, Any]:
    body = example("ModelDeployment", name)
    body["spec"]["regions"] = [{"pool": POOL, "minInstances": 1, "maxInstances": max_instances}]
    body["spec"]["scaling"] = {"strategy": "lt-i", "cooldownSeconds": 1}
    body["spec"].pop("niw", None)  # no spot Deployments: only the serving replicas count here
    return body


def _current(op: RunningOperator, name: str) -> int:
    md = op.get("ModelDeployment", name, NS)
    assert md is not None
    (region,) = md["status"]["regions"]
    return int(region["current"])


def _allocations(op: RunningOperator) -> dict[str, tuple[int, int]]:
    pool = op.get("RegionPool", POOL)
    assert pool is not None
    return {
        a["modelDeployment"].rpartition("/")[2]: (a["instances"], a["gpus"])
        for a in pool["status"]["allocations"]
    }


def _item_reads(op: RunningOperator, mark: int, plural: str) -> list[str]:
    """Paths of single-object GETs of `plural` since `mark`: each is one reconcile's fresh read."""
    return [
        r.path for r in op.emulator.requests[mark:] if r.method == "GET" and f"/{plural}/" in r.path
    ]


async def _older_on_one_instance(scaling: Scaling) -> RunningOperator:
    """A pool of 8 GPUs, a TenantPolicy, and the older ModelDeployment on 1 instance of 4 GPUs."""
    op = scaling.op
    pool = example("RegionPool", POOL)
    pool["spec"]["capacity"] = {"gpus": 8}
    policy = example("TenantPolicy", "enterprise")  # selects the older one by its label
    await op.apply([pool, policy, _model_deployment(OLDER, max_instances=2)])
    await op.settle()
    assert _allocations(op) == {OLDER: (1, 4)}
    return op


async def _younger_short(scaling: Scaling) -> RunningOperator:
    """The older one scaled up to 2 x 4 GPUs by the operator, then a younger one that needs
    1 GPU more than is left: Degraded, short of capacity."""
    op = await _older_on_one_instance(scaling)
    await scaling.plan(OLDER, target=2)
    assert _current(op, OLDER) == 2
    await op.apply([_model_deployment(YOUNGER, max_instances=4)])
    await op.settle()
    degraded = condition(op.get("ModelDeployment", YOUNGER, NS), "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InsufficientPoolCapacity")
    return op


async def test_an_older_scale_up_wakes_the_pool_and_no_tenant_policy(scaling: Scaling) -> None:
    op = await _older_on_one_instance(scaling)

    mark = op.emulator.mark()
    await scaling.plan(OLDER, target=2)
    assert _current(op, OLDER) == 2
    # The pool's allocation moved: it is re-reconciled at once ...
    assert _allocations(op) == {OLDER: (2, 8)}
    pool = op.get("RegionPool", POOL)
    assert pool is not None
    assert pool["status"]["freeGpus"] == 0
    # ... but not the TenantPolicies, which read no replicas.
    assert _item_reads(op, mark, "tenantpolicies") == []


async def test_an_older_scale_down_wakes_the_pool_and_the_younger_one_short(
    scaling: Scaling,
) -> None:
    op = await _younger_short(scaling)

    mark = op.emulator.mark()
    await scaling.plan(OLDER, target=1)
    assert _current(op, OLDER) == 1
    deployment = op.get("Deployment", f"{OLDER}-{POOL}", NS)
    assert deployment is not None
    assert deployment["spec"]["replicas"] == 1

    degraded = condition(op.get("ModelDeployment", YOUNGER, NS), "Degraded")
    assert degraded["status"] == "False", degraded
    assert _allocations(op) == {OLDER: (1, 4), YOUNGER: (1, 1)}
    pool = op.get("RegionPool", POOL)
    assert pool is not None
    assert pool["status"]["freeGpus"] == 3
    assert condition(pool, "Degraded")["status"] == "False"
    assert _item_reads(op, mark, "tenantpolicies") == []


async def test_a_child_status_update_that_moves_no_replicas_fans_out_nothing(
    scaling: Scaling,
) -> None:
    op = await _younger_short(scaling)

    mark = op.emulator.mark()
    status = {"status": {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2}}
    await op.kube.merge_patch(DEPLOYMENTS, f"{OLDER}-{POOL}", status, NS, "status")
    await op.settle(quiet_s=1.0)
    md = op.get("ModelDeployment", OLDER, NS)
    assert md is not None
    assert md["status"]["regions"][0]["ready"] == 1  # the owner was reconciled and wrote status
    assert _current(op, OLDER) == 2
    # No pool, policy or (Degraded, younger) pool sharer was woken for it.
    assert _item_reads(op, mark, "regionpools") == []
    assert _item_reads(op, mark, "tenantpolicies") == []
    younger = f"/namespaces/{NS}/modeldeployments/{YOUNGER}"
    assert not any(p.endswith(younger) for p in _item_reads(op, mark, "modeldeployments"))
