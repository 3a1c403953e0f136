"""What the reconciler writes for a ModelDeployment the hourly planner leaves out, end to end.

Since the planner drops a left-out ModelDeployment's plan, its status must stop showing one: before
the fix `status.regions[].target`, `lastForecastPeak`, the plan times, `targetInstances` and
`ForecastHealthy=True/Arima` stayed as the last plan left them (and an invalid spec kept its old
`Planned=True` too), telling the user a plan was in force that no longer was.

Real: Kopf, the operator's handlers and reconciler, the planner's round (forecast, ILP). Fake: the
cluster (the API emulator) and Prometheus (a flat 30,000 tokens/s of mistral-7b in us-east).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleetwarden.metrics.client import Series as PromSeries
from fleetwarden.operator.autoscaler import Autoscaler
from fleetwarden.operator.hourly_planner import FleetPlanner
from fleetwarden.operator.plan_status import PlanBook
from tests.support.fleet_operator import RunningOperator, example_objects, running_operator
from tests.support.kube_emulator import KubeEmulator

NS = "llm-serving"
NAME = "mistral-7b"
POOL = "us-east-a100"
PLAN_FIELDS = ("target", "lastForecastPeak", "lastForecastTime", "lastPlanTime")
pytestmark = pytest.mark.timeout(120)


class Prometheus:
    """30 h of a flat 30,000 tokens/s of mistral-7b in us-east (the cheap last-peak path)."""

    def range_series(
        self, query: str, start_s: float, end_s: float, step_s: float
    ) -> list[PromSeries]:
        if "niw_tokens" in query:
            return []
        stamps = tuple(end_s - k * step_s for k in range(int(30 * 3600 / step_s)))[::-1]
        labels = {"model": NAME, "region": "us-east"}
        return [PromSeries(labels, stamps, (30_000.0,) * len(stamps))]


def objects() -> list[dict[str, Any]]:
    """The example pools and mistral-7b, in us-east-a100 only, planned hour by hour (LT-I)."""
    out = [copy.deepcopy(o) for o in example_objects() if o["kind"] == "RegionPool"]
    md = next(o for o in example_objects() if o["metadata"]["name"] == NAME)
    md = copy.deepcopy(md)
    md["spec"]["regions"] = [{"pool": POOL, "minInstances": 2, "maxInstances": 16}]
    md["spec"]["scaling"] = {"strategy": "lt-i", "cooldownSeconds": 1}
    return [*out, md]


@dataclasses.dataclass
class Planned:
    op: RunningOperator
    planner: FleetPlanner

    def status(self) -> dict[str, Any]:
        md = self.op.get("ModelDeployment", NAME, NS)
        assert md is not None
        return dict(md.get("status") or {})

    def region(self) -> dict[str, Any]:
        (region,) = self.status()["regions"]
        return dict(region)

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.status()["conditions"] if c["type"] == kind)

    async def round(self) -> None:
        assert await self.planner.plan_once()
        await self.op.settle()

    async def patch_spec(self, spec: dict[str, Any]) -> None:
        md = self.op.get("ModelDeployment", NAME, NS)
        assert md is not None
        await self.op.patch(md, {"spec": spec})
        await self.op.settle()


@pytest.fixture
async def planned() -> AsyncIterator[Planned]:
    """The operator with a plan book (no autoscaler: replicas stay at their minimum) and a
    planner over a fake Prometheus, after a first round planned mistral-7b."""
    async with KubeEmulator() as emulator, running_operator(emulator) as op:
        book = PlanBook()
        op.runtime.context = dataclasses.replace(op.runtime.context, plans=book)
        await op.apply(objects())
        await op.settle()
        planner = FleetPlanner(
            Prometheus(),  # type: ignore[arg-type]  # duck-typed: range_series only
            Autoscaler(),
            book,
            op.runtime.view,
            op.runtime.model_deployments.request,
        )
        try:
            fleet = Planned(op, planner)
            await fleet.round()
            assert fleet.region()["target"] == 6  # 30,000 tokens/s / 5200 per instance
            assert fleet.status()["targetInstances"] == 6
            assert fleet.condition("Planned")["reason"] == "Planned"
            # a flat series takes the last-peak path: a fallback, but a forecast in force
            assert fleet.condition("ForecastHealthy")["reason"] == "ForecastFallback"
            yield fleet
        finally:
            planner.close()


def assert_no_plan_in_force(fleet: Planned, why: str) -> None:
    region = fleet.region()
    assert [f for f in PLAN_FIELDS if f in region] == [], region
    assert (region["pool"], region["current"]) == (POOL, 2)  # the rest of the region stays
    assert "targetInstances" not in fleet.status()
    for kind in ("Planned", "ForecastHealthy"):
        condition = fleet.condition(kind)
        assert (condition["status"], condition["reason"]) == ("False", "NotPlannable"), condition
        assert why in condition["message"], condition


async def test_a_left_out_model_deployment_shows_no_plan_and_says_why(planned: Planned) -> None:
    await planned.patch_spec({"throughput": {"A100-80GB": None}})  # only H100-80GB is left
    await planned.round()
    assert_no_plan_in_force(planned, "no throughput for GPU type A100-80GB of pool us-east-a100")

    mark = planned.op.emulator.mark()
    for _ in range(2):  # later rounds change nothing: no write
        await planned.round()
    planned.op.runtime.model_deployments.request(f"{NS}/{NAME}")
    await planned.op.settle()
    assert planned.op.emulator.writes_since(mark) == []

    await planned.patch_spec({"throughput": {"A100-80GB": 5200}})  # fixed: planned again
    await planned.round()
    assert planned.region()["target"] == 6
    assert planned.condition("Planned")["reason"] == "Planned"
    events = [e for e in planned.op.events_for(NAME, NS) if e["reason"] == "Planned"]
    assert len(events) == 2  # the first plan, and the plan after the fix


async def test_an_invalid_spec_shows_no_plan_and_says_why(planned: Planned) -> None:
    """An invalid spec is reconciled apart (nothing but conditions was written) and kept the old
    plan fields and `Planned=True`."""
    await planned.patch_spec(
        {"regions": [{"pool": POOL, "minInstances": 5, "maxInstances": 2}]}  # past the schema
    )
    await planned.round()
    assert_no_plan_in_force(planned, "minInstances must be <= maxInstances")
    ready = planned.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")

    mark = planned.op.emulator.mark()
    await planned.round()
    assert planned.op.emulator.writes_since(mark) == []
