"""The operator scales serving Deployments from real Prometheus data.

Real: Prometheus (Debian's binary, scraping a live exporter every second), Kopf and the operator,
the scaling strategies. Mocked: the cluster (the API emulator; no kubelet, so no pods run: the
test's `ControllerManager` writes Deployment readiness as the controller-manager would, and can
hold new replicas "loading") and the sidecars, whose `fleetwarden_kv_cache_utilization` gauge the
test sets through an exporter.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from fleetwarden.metrics import names
from fleetwarden.operator.kube import DEPLOYMENTS
from fleetwarden.operator.main import OperatorSettings
from tests.support.eventually import eventually as _eventually
from tests.support.fleet_operator import RunningOperator, example_objects, running_operator
from tests.support.kube_emulator import KubeEmulator
from tests.support.prometheus_server import MetricsExporter, PrometheusFactory, prometheus_factory

__all__ = ["prometheus_factory"]
pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]
NS = "llm-serving"
DEPLOYMENT = "mistral-7b-us-east-a100"


async def eventually(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    await _eventually(check, timeout_s)


def replicas(op: RunningOperator) -> int:
    deployment = op.get("Deployment", DEPLOYMENT, NS)
    assert deployment is not None
    return int(deployment["spec"]["replicas"])


def scaling_condition(op: RunningOperator) -> dict[str, Any]:
    md = op.get("ModelDeployment", "mistral-7b", NS) or {}
    for condition in md.get("status", {}).get("conditions", []):
        if condition["type"] == "Scaling":
            return dict(condition)
    return {}


def scaling_reason(op: RunningOperator) -> str | None:
    """The region's `status.regions[].scalingReason`: why the scaler held or moved it last."""
    md = op.get("ModelDeployment", "mistral-7b", NS) or {}
    regions = md.get("status", {}).get("regions") or [{}]
    return regions[0].get("scalingReason")


class ControllerManager:
    """Marks the serving Deployment's replicas ready shortly after they are asked for, unless
    `loading` holds them back (a model still loading)."""

    def __init__(self, op: RunningOperator) -> None:
        self.op = op
        self.loading = False

    async def run(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            deployment = self.op.get("Deployment", DEPLOYMENT, NS)
            if deployment is None:
                continue
            wanted = int(deployment["spec"]["replicas"])
            ready = (deployment.get("status") or {}).get("readyReplicas") or 0
            # Removed pods go at once; new ones are ready only when nothing is loading.
            now_ready = min(ready, wanted) if self.loading else wanted
            if ready != now_ready:
                await self.op.kube.merge_patch(
                    DEPLOYMENTS,
                    DEPLOYMENT,
                    {"status": {"replicas": wanted, "readyReplicas": now_ready}},
                    NS,
                    "status",
                )


@pytest.fixture
def exporter() -> AsyncIterator[tuple[Gauge, MetricsExporter]]:
    registry = CollectorRegistry()
    gauge = Gauge(names.KV_CACHE_UTILIZATION, "kv", [names.MODEL, names.REGION], registry=registry)
    tokens = Counter(
        names.TOKENS, "tokens", [names.MODEL, names.REGION, names.KIND], registry=registry
    )
    tokens.labels("mistral-7b", "us-east", "output").inc(1000)
    with MetricsExporter(registry) as served:
        yield gauge, served


async def test_reactive_scaling_follows_utilisation_and_holds_without_prometheus(
    prometheus_factory: PrometheusFactory, exporter: tuple[Gauge, MetricsExporter]
) -> None:
    gauge, served = exporter
    utilisation = gauge.labels("mistral-7b", "us-east")
    utilisation.set(0.95)
    prometheus = prometheus_factory.start(targets={"sidecars": [served.address]})
    settings = OperatorSettings(
        peering_name=None,
        resync_seconds=3600,
        prometheus_url=prometheus.url,
        metrics_interval_seconds=0.5,
    )
    objects = [copy.deepcopy(o) for o in example_objects() if o["kind"] != "Namespace"]
    md = next(
        o
        for o in objects
        if o["metadata"]["name"] == "mistral-7b" and o["kind"] == "ModelDeployment"
    )
    md["spec"]["regions"] = [{"pool": "us-east-a100", "minInstances": 1, "maxInstances": 3}]
    md["spec"]["scaling"] = {"strategy": "reactive", "cooldownSeconds": 1}
    async with KubeEmulator() as emulator, running_operator(emulator, settings) as op:
        controller = ControllerManager(op)
        marking = asyncio.create_task(controller.run())
        try:
            await _scaling_scenario(op, objects, utilisation, prometheus, controller)
        finally:
            marking.cancel()


async def _scaling_scenario(
    op: RunningOperator,
    objects: list[dict[str, Any]],
    utilisation: Any,
    prometheus: Any,
    controller: ControllerManager,
) -> None:
    await op.apply(objects)
    await eventually(lambda: op.get("Deployment", DEPLOYMENT, NS) is not None)

    # Hot: one instance per cooldown up to maxInstances, and no further.
    await eventually(lambda: replicas(op) == 3)
    await asyncio.sleep(2.0)
    assert replicas(op) == 3
    condition = scaling_condition(op)
    assert (condition["status"], condition["reason"]) == ("True", "MetricsAvailable")
    reasons = [e["reason"] for e in op.events_for("mistral-7b", NS)]
    assert reasons.count("Scaled") >= 2
    status = op.get("ModelDeployment", "mistral-7b", NS)["status"]  # type: ignore[index]
    assert status["regions"][0]["utilization"] == pytest.approx(0.95)
    # status says why the region holds: at its maximum
    await eventually(lambda: scaling_reason(op) == "at-max")

    # A manual edit of the replicas is drift: corrected back to the operator's decision.
    deployment = op.get("Deployment", DEPLOYMENT, NS)
    assert deployment is not None
    utilisation.set(0.5)  # in band: the scaler holds, so only drift repair acts
    await asyncio.sleep(1.5)
    await op.patch(deployment, {"spec": {"replicas": 7}})
    await eventually(lambda: replicas(op) == 3)

    await eventually(lambda: scaling_reason(op) == "utilisation-in-band")

    # Cold: down to minInstances.
    utilisation.set(0.05)
    await eventually(lambda: replicas(op) == 1)
    await eventually(lambda: scaling_reason(op) == "at-min")

    # A replica still loading is capacity bought: one burst adds one instance, not one per
    # cooldown until the first is ready (4 cooldowns pass here).
    controller.loading = True
    utilisation.set(0.95)
    await eventually(lambda: replicas(op) == 2)
    await asyncio.sleep(4.0)
    assert replicas(op) == 2
    controller.loading = False  # it is ready, the region still runs hot: the next one
    await eventually(lambda: replicas(op) == 3)
    utilisation.set(0.05)
    await eventually(lambda: replicas(op) == 1)

    # Prometheus gone: hold (never to zero), and say why.
    utilisation.set(0.95)
    prometheus.stop()
    await eventually(lambda: scaling_condition(op).get("reason") == "PrometheusUnavailable")
    await asyncio.sleep(2.0)
    assert replicas(op) == 1
