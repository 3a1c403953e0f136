"""A round's plans carry the planner's period, so LT-UA's last window ends where the next round
starts rather than at the end of a fixed hour.

With `horizonSeconds: 1800` the planner runs at minutes 0 and 30, but every plan reached the
autoscaler without a period and LT-UA used 3600 s: its "last 20 minutes" were minutes 40-60 of
the hour (the review's r04), so the window never preceded the round at minute 30.

The planner reads a real Prometheus, backfilled with a day and a quarter of tokens/s (the
forecaster's seasonal fallback: no ARIMA fit to wait for), as in `test_hourly_plan_e2e`.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from fleetwarden.metrics.client import PrometheusClient, RetryPolicy
from fleetwarden.operator.autoscaler import Autoscaler, RegionSignal
from fleetwarden.operator.fleet import FleetView, ObjectRecord, parse_model_deployment
from fleetwarden.operator.hourly_planner import FleetPlanner
from fleetwarden.operator.plan_status import PlanBook
from fleetwarden.scaling import DecisionReason
from tests.operator.plan_history import history_document
from tests.support.prometheus_server import PrometheusFactory, prometheus_factory

__all__ = ["prometheus_factory"]
pytestmark = [pytest.mark.timeout(240)]

KEY = ("ns/a", "p")


def view(horizon_s: int) -> FleetView:
    """Pool p and one LT-UA ModelDeployment planned every `horizon_s` seconds."""
    pool = {
        "kind": "RegionPool",
        "metadata": {"name": "p", "uid": "p", "generation": 1},
        "spec": {"region": "r", "gpuType": "A100", "capacity": {"gpus": 64}, "costPerHour": 2},
    }
    md: dict[str, Any] = {
        "kind": "ModelDeployment",
        "metadata": {"name": "a", "namespace": "ns", "uid": "a", "generation": 1},
        "spec": {
            "model": {"name": "a", "gpusPerInstance": 1},
            "throughput": {"A100": 5000},
            "regions": [{"pool": "p", "minInstances": 1, "maxInstances": 16}],
            "scaling": {
                "strategy": "lt-ua",
                "cooldownSeconds": 1,
                "forecast": {"horizonSeconds": horizon_s},
            },
        },
    }
    return FleetView.of(
        pools=[ObjectRecord.from_body(pool)], model_deployments=[ObjectRecord.from_body(md)]
    )


@pytest.fixture(scope="module")
def history(prometheus_factory: PrometheusFactory) -> tuple[str, float]:
    """A real Prometheus holding model `a` in region `r` up to now, and that instant."""
    now = time.time()
    document = history_document(
        now - 30.0, series={("a", "r"): (5_000.0, 30_000.0)}, peak_at_s=now + 1800.0, days=1.25
    )
    return prometheus_factory.start(history=document).url, now


async def planned(history: tuple[str, float], horizon_s: int) -> Autoscaler:
    url, now = history
    autoscaler = Autoscaler()
    current = view(horizon_s)
    client = PrometheusClient(url, retry=RetryPolicy(attempts=1))
    planner = FleetPlanner(
        client, autoscaler, PlanBook(), lambda: current, lambda key: None, clock=lambda: now
    )
    try:
        assert await planner.plan_once()
    finally:
        planner.close()
        client.close()
    return autoscaler


async def test_plans_carry_the_planners_period(history: tuple[str, float]) -> None:
    assert (await planned(history, 1800)).plans[KEY].period_s == 1800.0
    assert (await planned(history, 3600)).plans[KEY].period_s == 3600.0


async def test_lt_ua_passes_the_target_in_the_last_minutes_of_a_half_hour_period(
    history: tuple[str, float],
) -> None:
    """At minute 25 of a 30-minute period, a load 10x the forecast is in LT-UA's last window
    (lastWindowMinutes 20 of 30): it scales past the target. With the fixed hour it was not."""
    autoscaler = await planned(history, 1800)
    plan = autoscaler.plans[KEY]
    spec = parse_model_deployment(view(1800).model_deployments["ns/a"]).spec
    assert spec is not None
    start = (history[1] // 3600 + 1) * 3600  # an hour's start: minute 25 is outside minutes 40-60
    now = start + 25 * 60
    autoscaler.signals[KEY] = RegionSignal(now, 0.95, 10 * (plan.forecast_peak_tps or 1.0))
    step = autoscaler.step("ns/a", spec, spec.regions[0], plan.target, now)
    assert step is not None
    assert step.decision.reason is DecisionReason.LOAD_ABOVE_FORECAST
    assert step.after == plan.target + 1
