"""The operator's hourly fleet plan from real Prometheus history, end to end.

Real: Prometheus (Debian's binary) with three days of diurnal tokens/s backfilled by promtool
before it starts, the forecaster (ARIMA), the ILP (HiGHS), Kopf and the operator, the scaler.
Mocked: the cluster (the API emulator; no kubelet, so no pods run) and the sidecars, whose
utilisation gauge a test exporter serves.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # statsmodels on busy cores

import asyncio
import copy
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge

from fleetwarden.metrics import names
from fleetwarden.metrics.client import PrometheusClient, RetryPolicy
from fleetwarden.operator.autoscaler import Autoscaler
from fleetwarden.operator.fleet import FleetView, ObjectRecord
from fleetwarden.operator.hourly_planner import FleetPlanner
from fleetwarden.operator.main import OperatorSettings
from fleetwarden.operator.plan_status import PlanBook
from tests.operator.plan_history import history_document
from tests.support.eventually import eventually
from tests.support.fleet_operator import RunningOperator, example_objects, running_operator
from tests.support.kube_emulator import KubeEmulator
from tests.support.prometheus_server import (
    MetricsExporter,
    PrometheusFactory,
    free_port,
    prometheus_factory,
)

__all__ = ["prometheus_factory"]
pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
NS = "llm-serving"
EAST = "mistral-7b-us-east-a100"
THETA = 5200.0  # mistral-7b on A100-80GB, examples/20-modeldeployments.yaml


def fleet_objects() -> list[dict[str, Any]]:
    """The examples, with mistral-7b in us-east only, planned hour by hour (LT-I)."""
    objects = [copy.deepcopy(o) for o in example_objects() if o["kind"] != "Namespace"]
    md = next(
        o
        for o in objects
        if o["kind"] == "ModelDeployment" and o["metadata"]["name"] == "mistral-7b"
    )
    md["spec"]["regions"] = [{"pool": "us-east-a100", "minInstances": 2, "maxInstances": 16}]
    md["spec"]["scaling"] = {"strategy": "lt-i", "cooldownSeconds": 1}
    return objects


def condition(op: RunningOperator, name: str, kind: str) -> dict[str, Any]:
    md = op.get("ModelDeployment", name, NS) or {}
    for c in md.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return dict(c)
    return {}


def region_status(op: RunningOperator, name: str, pool: str) -> dict[str, Any]:
    md = op.get("ModelDeployment", name, NS) or {}
    for r in md.get("status", {}).get("regions", []):
        if r["pool"] == pool:
            return dict(r)
    return {}


def replicas(op: RunningOperator, name: str) -> int:
    deployment = op.get("Deployment", name, NS)
    assert deployment is not None
    return int(deployment["spec"]["replicas"])


@pytest.fixture
def utilisation() -> Iterator[tuple[Gauge, MetricsExporter]]:
    registry = CollectorRegistry()
    gauge = Gauge(names.KV_CACHE_UTILIZATION, "kv", [names.MODEL, names.REGION], registry=registry)
    with MetricsExporter(registry) as served:
        yield gauge, served


def backfilled(factory: PrometheusFactory, targets: dict[str, list[str]] | None = None) -> Any:
    now = time.time()
    history = history_document(
        now - 30.0,
        series={("mistral-7b", "us-east"): (5_000.0, 30_000.0)},
        peak_at_s=now + 1800.0,  # the coming hour holds the daily peak
    )
    return factory.start(targets=targets, history=history)


async def test_hourly_plan_sets_targets_conditions_and_drives_the_scaler(
    prometheus_factory: PrometheusFactory, utilisation: tuple[Gauge, MetricsExporter]
) -> None:
    gauge, served = utilisation
    gauge.labels("mistral-7b", "us-east").set(0.5)
    prometheus = backfilled(prometheus_factory, {"sidecars": [served.address]})
    settings = OperatorSettings(
        peering_name=None,
        resync_seconds=3600,
        prometheus_url=prometheus.url,
        metrics_interval_seconds=0.5,
    )
    async with KubeEmulator() as emulator, running_operator(emulator, settings) as op:
        await op.apply(fleet_objects())
        await eventually(lambda: "target" in region_status(op, "mistral-7b", "us-east-a100"), 120)

        east = region_status(op, "mistral-7b", "us-east-a100")
        peak = east["lastForecastPeak"]
        # The coming hour peaks near 30,000 tokens/s (+ 10% of 2,000 NIW tokens/s).
        assert 20_000 <= peak <= 45_000
        assert east["target"] == max(2, math.ceil(peak / THETA - 1e-9))
        assert east["lastForecastTime"].endswith("Z")
        assert east["lastPlanTime"].endswith("Z")
        md = op.get("ModelDeployment", "mistral-7b", NS)
        assert md is not None
        assert md["status"]["targetInstances"] == east["target"]
        planned = condition(op, "mistral-7b", "Planned")
        assert (planned["status"], planned["reason"]) == ("True", "Planned")
        assert "us-east-a100=" in planned["message"]
        healthy = condition(op, "mistral-7b", "ForecastHealthy")
        assert (healthy["status"], healthy["reason"]) == ("True", "Arima")
        events = [e for e in op.events_for("mistral-7b", NS) if e["reason"] == "Planned"]
        assert len(events) == 1
        assert f"us-east-a100 2 -> {east['target']}" in events[0]["message"]

        # LT-I: the scaler walks the Deployment to the plan's target, one step per cooldown.
        await eventually(lambda: replicas(op, EAST) == east["target"])

        # llama-3-70b has no history anywhere: no plan, its replicas hold at their minimum.
        llama = condition(op, "llama-3-70b", "Planned")
        assert (llama["status"], llama["reason"]) == ("False", "NoHistory")
        no_data = condition(op, "llama-3-70b", "ForecastHealthy")
        assert (no_data["status"], no_data["reason"]) == ("False", "NoData")
        assert replicas(op, "llama-3-70b-us-east-a100") == 2
        assert region_status(op, "llama-3-70b", "us-east-a100")["target"] == 2


async def test_prometheus_down_sets_planned_false_and_holds_replicas() -> None:
    settings = OperatorSettings(
        peering_name=None,
        resync_seconds=3600,
        prometheus_url=f"http://127.0.0.1:{free_port()}",  # nothing listens there
        metrics_interval_seconds=0.5,
    )
    async with KubeEmulator() as emulator, running_operator(emulator, settings) as op:
        await op.apply(fleet_objects())
        await eventually(
            lambda: condition(op, "mistral-7b", "Planned").get("reason") == "PrometheusUnavailable"
        )
        assert condition(op, "mistral-7b", "Planned")["status"] == "False"
        await asyncio.sleep(1.0)
        assert replicas(op, EAST) == 2
        assert "target" not in region_status(op, "mistral-7b", "us-east-a100")


def _records() -> FleetView:
    records = []
    for obj in fleet_objects():
        if obj["kind"] in ("RegionPool", "ModelDeployment"):
            body = copy.deepcopy(obj)
            body["metadata"].setdefault("uid", body["metadata"]["name"])
            body["metadata"].setdefault("generation", 1)
            records.append(ObjectRecord.from_body(body))
    pools = [r for r in records if r.kind == "RegionPool"]
    mds = [r for r in records if r.kind == "ModelDeployment"]
    return FleetView.of(pools=pools, model_deployments=mds)


async def test_the_previous_plan_stays_when_prometheus_goes_away(
    prometheus_factory: PrometheusFactory,
) -> None:
    prometheus = backfilled(prometheus_factory)
    autoscaler, book, asked = Autoscaler(), PlanBook(), []
    view = _records()
    client = PrometheusClient(prometheus.url, retry=RetryPolicy(attempts=1))
    planner = FleetPlanner(client, autoscaler, book, lambda: view, asked.append)
    try:
        assert await planner.plan_once()
        key = ("llm-serving/mistral-7b", "us-east-a100")
        plan = autoscaler.plans[key]
        assert plan.target >= 4
        assert ("llm-serving/llama-3-70b", "us-east-a100") not in autoscaler.plans
        assert "llm-serving/mistral-7b" in asked

        prometheus.stop()
        assert not await planner.plan_once()
        assert autoscaler.plans[key] == plan
        health = book.health_of("llm-serving/mistral-7b")
        assert health is not None
        assert (health.planned, health.reason) == (False, "PrometheusUnavailable")
        now = 1000.0 * 3600 + 60.0
        assert planner.retry_delay_s(now, 3600.0) == 5.0
        assert not await planner.plan_once()
        assert planner.retry_delay_s(now, 3600.0) == 10.0
        # Never later than the next boundary: 3 s before it, the retry waits 3 s.
        assert planner.retry_delay_s(1001.0 * 3600 - 3.0, 3600.0) == pytest.approx(3.0)
    finally:
        planner.close()
        client.close()


async def test_kept_fits_plan_what_fresh_fits_plan(prometheus_factory: PrometheusFactory) -> None:
    """`--forecast-refit-hours`: the first round fits (it is a fresh fit), the next one within
    the refit period reuses the parameters, and both give the targets fresh fits give."""
    prometheus = backfilled(prometheus_factory)
    view = _records()
    client = PrometheusClient(prometheus.url, retry=RetryPolicy(attempts=1))
    # Both rounds at one instant: they read the same history. With the wall clock a slow machine
    # put round 2 tens of seconds later, where the backfilled samples (one per step) give a
    # shifted rate series, and the kept parameters were refused for it (a refit, not a reuse).
    now = time.time()
    fresh = FleetPlanner(
        client, Autoscaler(), PlanBook(), lambda: view, lambda key: None, clock=lambda: now
    )
    kept = FleetPlanner(
        client,
        Autoscaler(),
        PlanBook(),
        lambda: view,
        lambda key: None,
        refit_every_s=86400.0,
        clock=lambda: now,
    )
    key = ("llm-serving/mistral-7b", "us-east-a100")
    try:
        assert fresh.warm is None
        for round_number in (1, 2):
            assert await fresh.plan_once()
            assert await kept.plan_once()
            assert kept.autoscaler.plans[key].target == fresh.autoscaler.plans[key].target
            assert kept.warm is not None
            assert (kept.warm.fits, kept.warm.reuses) == (1, round_number - 1)
    finally:
        fresh.close()
        kept.close()
        client.close()
