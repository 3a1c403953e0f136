"""The operator's scaling loop (`Autoscaler` and `MetricsPoller`), as a review found it broken.

- r11: a region with `minInstances: 0` at 0 replicas has no utilisation series, so no signal;
  `step` returned None (hold) forever, whatever the plan said.
- r05: on a failed poll the old signals stayed, and each reconcile after the cooldown took one
  more step on the same pre-outage reading (8 -> 1 while Prometheus was down).
- r06: the poller's rate window was 1m: at a 30 s scrape one missed scrape (at 60 s, nearly
  always) left no load, and the Scaling condition still said the load was read.
- r04: LT-UA's window was the last 20 minutes of the wall-clock hour whatever the plan period.

Real: the autoscaler, the scalers, the poller, the API models. Fake: Prometheus (a client
answering canned samples or failing) and the clock.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec
from fleetwarden.metrics.client import PrometheusUnavailable, Sample
from fleetwarden.operator import conditions
from fleetwarden.operator.autoscaler import Autoscaler, RegionPlan, RegionSignal
from fleetwarden.operator.fleet import FleetView, parse_model_deployment
from fleetwarden.operator.metrics_poller import MetricsPoller
from fleetwarden.scaling import DecisionReason
from tests.operator.fixtures import example, record

R = DecisionReason
T0 = 1_800_000_000.0
"""A whole hour since the epoch."""
MD = "llm-serving/mistral-7b"
POOL = "us-east-a100"
KEY = (MD, POOL)


def _spec(strategy: str, min_instances: int = 1, **scaling: Any) -> ModelDeploymentSpec:
    return ModelDeploymentSpec.model_validate(
        {
            "model": {"name": "m"},
            "throughput": {"A100-80GB": 1000},
            "regions": [{"pool": POOL, "minInstances": min_instances, "maxInstances": 10}],
            "scaling": {"strategy": strategy, **scaling},
        }
    )


# r11: leaving 0 ------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["reactive", "lt-i", "lt-u", "lt-ua"])
def test_a_region_at_zero_replicas_steps_toward_a_plan_above_zero(strategy: str) -> None:
    spec = _spec(strategy, min_instances=0)
    autoscaler = Autoscaler()
    autoscaler.plans[KEY] = RegionPlan(target=0, forecast_peak_tps=0.0)
    autoscaler.signals[KEY] = RegionSignal(T0, utilisation=0.05, load_tps=0.0)
    down = autoscaler.step(MD, spec, spec.regions[0], current=1, now_s=T0)
    assert down is not None
    assert (down.before, down.after) == (1, 0)
    # no pod: the poller writes no signal, the old one ages out; the next plan asks for 4
    autoscaler.plans[KEY] = RegionPlan(target=4, forecast_peak_tps=4000.0)
    early = autoscaler.step(MD, spec, spec.regions[0], current=0, now_s=T0 + 5.0)
    assert early is not None
    assert (early.after, early.decision.reason) == (0, R.COOLDOWN)
    later = autoscaler.step(MD, spec, spec.regions[0], current=0, now_s=T0 + 600.0)
    assert later is not None
    assert (later.before, later.after, later.decision.reason) == (0, 1, R.TOWARD_TARGET)


def test_zero_replicas_with_no_plan_or_a_zero_plan_hold() -> None:
    spec = _spec("lt-u", min_instances=0)
    autoscaler = Autoscaler()
    assert autoscaler.step(MD, spec, spec.regions[0], current=0, now_s=T0) is None
    autoscaler.plans[KEY] = RegionPlan(target=0, forecast_peak_tps=0.0)
    assert autoscaler.step(MD, spec, spec.regions[0], current=0, now_s=T0) is None


def test_zero_replicas_hold_while_prometheus_is_down() -> None:
    """Fail static: with Prometheus failing nothing moves, not even up from 0."""
    spec = _spec("lt-u", min_instances=0)
    autoscaler = Autoscaler()
    autoscaler.plans[KEY] = RegionPlan(target=4, forecast_peak_tps=4000.0)
    autoscaler.health = (False, conditions.PROMETHEUS_UNAVAILABLE, "down")
    assert autoscaler.step(MD, spec, spec.regions[0], current=0, now_s=T0) is None


# r05: one reading, one step; Prometheus down holds ---------------------------------------------


def test_one_signal_moves_a_region_once() -> None:
    spec = _spec("lt-u")
    autoscaler = Autoscaler()
    autoscaler.plans[KEY] = RegionPlan(target=1, forecast_peak_tps=1000.0)
    autoscaler.signals[KEY] = RegionSignal(T0, utilisation=0.1, load_tps=100.0)
    first = autoscaler.step(MD, spec, spec.regions[0], current=8, now_s=T0)
    assert first is not None
    assert first.after == 7
    for dt in (15.0, 30.0, 60.0):  # past the cooldown, same reading: hold
        again = autoscaler.step(MD, spec, spec.regions[0], current=7, now_s=T0 + dt)
        assert again is not None
        assert (again.after, again.decision.reason) == (7, R.COOLDOWN)
    autoscaler.signals[KEY] = RegionSignal(T0 + 75.0, utilisation=0.1, load_tps=100.0)
    fresh = autoscaler.step(MD, spec, spec.regions[0], current=7, now_s=T0 + 75.0)
    assert fresh is not None
    assert fresh.after == 6


class _Prometheus:
    """Answers the poller's queries with canned samples; `up = False` makes every query fail."""

    def __init__(self, utilisation: float, load: float | None) -> None:
        self.up = True
        self.utilisation = utilisation
        self.load = load
        self.queries: list[str] = []

    def instant(self, query: str, at_s: float | None = None) -> list[Sample]:
        if not self.up:
            raise PrometheusUnavailable("connection refused")
        self.queries.append(query)
        labels = {"model": "mistral-7b", "region": "us-east"}
        if "kv_cache" in query:
            return [Sample(labels, 0.0, self.utilisation)]
        if "fleetwarden_tokens_total" in query and self.load is not None:
            return [Sample(labels, 0.0, self.load)]
        return []


def _view(strategy: str = "lt-u") -> FleetView:
    body = copy.deepcopy(example("ModelDeployment", "mistral-7b"))
    body["spec"]["regions"] = [{"pool": POOL, "minInstances": 1, "maxInstances": 10}]
    body["spec"]["scaling"] = {"strategy": strategy}
    return FleetView.of(
        pools=[record(example("RegionPool", POOL))], model_deployments=[record(body)]
    )


def _poller(client: _Prometheus, autoscaler: Autoscaler, now: list[float]) -> MetricsPoller:
    view = _view()
    return MetricsPoller(
        client,  # type: ignore[arg-type]  # duck-typed: `instant` is all the poller calls
        autoscaler,
        view=lambda: view,
        request_reconcile=lambda key: None,
        clock=lambda: now[0],
    )


def test_prometheus_down_holds_every_region_on_the_last_reading() -> None:
    """The review's r05 through the real poller: one good poll, then failures every 15 s; each
    failed poll asks for a reconcile, which must hold (before: 8 -> 1, one step per poll)."""
    parsed = parse_model_deployment(_view().model_deployments[MD]).spec
    assert parsed is not None
    autoscaler, client, now = Autoscaler(), _Prometheus(utilisation=0.1, load=100.0), [T0]
    autoscaler.plans[KEY] = RegionPlan(target=1, forecast_peak_tps=1000.0)
    poller = _poller(client, autoscaler, now)

    async def run() -> list[int]:
        assert await poller.poll_once()
        client.up = False
        replicas = [8]
        for _ in range(8):
            now[0] += 15.0
            assert not await poller.poll_once()
            assert autoscaler.health_of(MD) is not None
            assert autoscaler.health_of(MD)[1] == conditions.PROMETHEUS_UNAVAILABLE  # type: ignore[index]
            step = autoscaler.step(MD, parsed, parsed.regions[0], replicas[-1], now[0])
            replicas.append(replicas[-1] if step is None else step.after)
        client.up = True
        now[0] += 15.0
        assert await poller.poll_once()
        step = autoscaler.step(MD, parsed, parsed.regions[0], replicas[-1], now[0])
        assert step is not None
        replicas.append(step.after)
        return replicas

    assert asyncio.run(run()) == [8] * 9 + [7]


# r06: the load window and the condition --------------------------------------------------------


def test_the_poller_reads_load_over_five_minutes() -> None:
    autoscaler, client = Autoscaler(), _Prometheus(utilisation=0.5, load=100.0)
    assert asyncio.run(_poller(client, autoscaler, [T0]).poll_once())
    rates = [q for q in client.queries if "rate(" in q]
    assert rates
    assert all("[5m]" in q for q in rates), rates
    assert autoscaler.signals[KEY].load_tps == 100.0


def test_a_missing_load_series_is_reported_not_claimed_read() -> None:
    autoscaler = Autoscaler()
    assert asyncio.run(
        _poller(_Prometheus(utilisation=0.5, load=None), autoscaler, [T0]).poll_once()
    )
    assert autoscaler.signals[KEY].load_tps is None
    health = autoscaler.health_of(MD)
    assert health is not None
    healthy, reason, message = health
    assert (healthy, reason) == (True, conditions.METRICS_AVAILABLE)
    assert "no tokens/s series for us-east" in message
    assert "load are read" not in message
    # the next poll with load back reads as before
    assert asyncio.run(
        _poller(_Prometheus(utilisation=0.5, load=1.0), autoscaler, [T0]).poll_once()
    )
    assert autoscaler.health_of(MD) == autoscaler.health


# r04: the plan's period ------------------------------------------------------------------------


def _ltua_step(autoscaler: Autoscaler, spec: ModelDeploymentSpec, minute: float) -> R:
    now = T0 + 60.0 * minute
    autoscaler.signals[KEY] = RegionSignal(now, utilisation=0.9, load_tps=6000.0)  # 6x forecast
    step = autoscaler.step(MD, spec, spec.regions[0], current=4, now_s=now)
    assert step is not None
    return step.decision.reason


def test_ltua_window_is_the_end_of_the_plans_period() -> None:
    """Plans every 30 minutes: the windows are minutes 10-30 and 40-60 of the hour."""
    spec = _spec("lt-ua", cooldownSeconds=1)
    autoscaler = Autoscaler()
    autoscaler.plans[KEY] = RegionPlan(target=4, forecast_peak_tps=1000.0, period_s=1800.0)
    got = [_ltua_step(autoscaler, spec, m) for m in (5, 15, 25, 29, 35, 45, 55)]
    past, at = R.LOAD_ABOVE_FORECAST, R.AT_TARGET
    assert got == [at, past, past, past, at, past, past]


def test_a_plan_period_shorter_than_the_window_makes_the_whole_period_the_window() -> None:
    spec = _spec("lt-ua", cooldownSeconds=1)
    autoscaler = Autoscaler()
    autoscaler.plans[KEY] = RegionPlan(target=4, forecast_peak_tps=1000.0, period_s=600.0)
    assert _ltua_step(autoscaler, spec, 1) is R.LOAD_ABOVE_FORECAST


def test_a_plan_without_a_period_keeps_the_autoscalers() -> None:
    spec = _spec("lt-ua", cooldownSeconds=1)
    autoscaler = Autoscaler()
    autoscaler.plans[KEY] = RegionPlan(target=4, forecast_peak_tps=1000.0)
    assert [_ltua_step(autoscaler, spec, m) for m in (25, 45)] == [
        R.AT_TARGET,
        R.LOAD_ABOVE_FORECAST,
    ]


@pytest.mark.parametrize("period", [0.0, -1.0, float("nan"), float("inf")])
def test_a_plan_period_that_is_no_period_is_refused(period: float) -> None:
    with pytest.raises(ValueError, match="period_s"):
        RegionPlan(target=1, forecast_peak_tps=None, period_s=period)
