"""The hourly round forecasts the hour after `now`, not the hour after the last sample.

A (model, region)'s series stops when its pods are gone, restart without traffic yet, or its scrape
breaks. Forecasting from the series' own end would plan an hour that is long over, reading the
daily profile at the wrong clock time, and report a healthy `arima` for it. The round pads the
history with missing samples up to `now_s` and reports a history silent for more than
`STALE_HISTORY_STEPS` as a degraded forecast (ForecastHealthy=False).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from fleetwarden.forecasting.hourly import (
    STALE_HISTORY_STEPS,
    EndpointHistory,
    FleetSpecs,
    RoundInput,
    plan_round,
)
from fleetwarden.forecasting.series import Series
from fleetwarden.metrics.client import Series as PromSeries
from fleetwarden.operator.autoscaler import Autoscaler
from fleetwarden.operator.fleet import FleetView, ObjectRecord
from fleetwarden.operator.hourly_planner import FleetPlanner
from fleetwarden.operator.plan_status import FORECAST_FALLBACK, PlanBook, apply_plan_status
from tests.forecasting.test_hourly import model, pool

STEP, DAY = 600.0, 86_400.0
NOON = 20 * DAY + 12 * 3600
"""The round: 12:00 UTC, the daily peak of `load`."""


def load(t: float) -> float:
    """Tokens/s on a daily cosine: 500 at 00:00 UTC, 9500 at 12:00 UTC."""
    return 5000.0 - 4500.0 * math.cos(2 * math.pi * (t % DAY) / DAY)


def history(end_s: float, days: float = 3.0) -> Series:
    start = end_s - days * DAY
    return Series(start, STEP, tuple(load(start + i * STEP) for i in range(int(days * DAY / STEP))))


FLEET = FleetSpecs({"p": pool("r")}, {"ns/a": model([("p", 1, 40)], throughput=1000.0)})


def round_on(series: Series, now_s: float = NOON) -> Any:
    inputs = RoundInput(FLEET, {("ns/a", "p"): EndpointHistory(series)}, {("ns/a", "p"): 1}, now_s)
    result = plan_round(inputs)
    return result.forecasts[("ns/a", "r")], result.endpoints[("ns/a", "p")]


# --- Series.padded_to and Series.trailing_missing ----------------------------------------------


def test_padded_to_extends_the_grid_with_missing_samples() -> None:
    s = Series(100.0, 10.0, (1.0, 2.0, 3.0))
    padded = s.padded_to(165.0)
    assert (padded.start_s, padded.step_s) == (100.0, 10.0)
    assert padded.values[:3] == (1.0, 2.0, 3.0)
    assert len(padded.values) == 6
    assert all(math.isnan(v) for v in padded.values[3:])
    assert padded.end_s == 160.0  # the last whole step that starts before 165
    assert s.padded_to(125.0) == s.until(125.0)  # a series reaching past end_s is cut
    assert s.padded_to(130.0) == s


def test_padded_to_keeps_only_the_last_keep_s() -> None:
    s = Series(0.0, 10.0, (1.0, 2.0, 3.0, 4.0))
    kept = s.padded_to(60.0, keep_s=30.0)
    assert kept.start_s == 30.0
    assert kept.values[0] == 4.0
    assert len(kept.values) == 3
    far = s.padded_to(1e12, keep_s=50.0)  # stopped long ago: the padding stays bounded
    assert len(far.values) == 5
    assert all(math.isnan(v) for v in far.values)
    assert far.end_s == pytest.approx(1e12, abs=10.0)


def test_padded_to_edge_cases() -> None:
    assert Series.of([]).padded_to(1e9).values == ()
    with pytest.raises(ValueError, match="keep_s"):
        Series.of([1.0]).padded_to(1e3, keep_s=math.nan)


@pytest.mark.parametrize(
    ("values", "missing"),
    [((1.0, 2.0), 0), ((1.0, math.nan, -1.0, math.inf), 3), ((math.nan, math.nan), 2), ((), 0)],
)
def test_trailing_missing(values: tuple[float, ...], missing: int) -> None:
    assert Series(0.0, 1.0, values).trailing_missing() == missing


# --- the round ---------------------------------------------------------------------------------


def test_a_history_that_stopped_is_forecast_from_now_and_reported_degraded() -> None:
    """r03: the series stopped at 00:00, the round is at 12:00 (the peak, 9500 tokens/s)."""
    region, endpoint = round_on(history(NOON - 12 * 3600))
    f = region.forecast
    assert NOON - STEP < f.start_s <= NOON
    assert f.model == "arima"
    assert f.peak == pytest.approx(9500.0, rel=0.1)  # from the series' end: ~600
    assert endpoint.target == 10
    assert endpoint.forecast_model == "arima"
    assert not endpoint.healthy
    assert endpoint.fallback_reason is not None
    assert "12.0 h" in endpoint.fallback_reason
    assert "stopped" in endpoint.fallback_reason


def test_a_history_reaching_now_is_healthy() -> None:
    region, endpoint = round_on(history(NOON - STALE_HISTORY_STEPS * STEP))
    assert NOON - STEP < region.forecast.start_s <= NOON
    assert region.stale_reason is None
    assert endpoint.healthy
    assert endpoint.fallback_reason is None
    assert endpoint.target == 10


def test_a_history_older_than_the_forecast_reads_holds_the_region() -> None:
    """Nothing left in the last `max_history_s`: no data, replicas hold, and the padding is
    bounded by that window however old the series is (here: decades)."""
    stopped = Series(0.0, 300.0, tuple(load(i * 300.0) for i in range(600)))  # 1970
    region, endpoint = round_on(stopped, now_s=1e9)  # 2001
    assert region.forecast.model == "no-data"
    assert region.forecast.diagnostics.n_input <= 28 * DAY / 300.0
    assert endpoint.held
    assert endpoint.target == 1
    assert not endpoint.healthy
    assert endpoint.fallback_reason is not None
    assert "stopped" in endpoint.fallback_reason


# --- through the operator's planner to the ForecastHealthy condition ----------------------------


class StoppedSeries:
    """A Prometheus whose tokens/s series for (m, r) stopped 12 h before the round; no NIW."""

    def range_series(
        self, query: str, start_s: float, end_s: float, step_s: float
    ) -> list[PromSeries]:
        if "niw_tokens" in query:
            return []
        s = history(end_s - 12 * 3600)
        stamps = tuple(float(t) for t in s.timestamps())
        return [PromSeries({"model": "m", "region": "r"}, stamps, s.values)]


def view() -> FleetView:
    pool_body = {
        "kind": "RegionPool",
        "metadata": {"name": "p", "uid": "p", "generation": 1},
        "spec": {"region": "r", "gpuType": "A100", "capacity": {"gpus": 64}, "costPerHour": 2},
    }
    md_body = {
        "kind": "ModelDeployment",
        "metadata": {"name": "a", "namespace": "ns", "uid": "a", "generation": 1},
        "spec": {
            "model": {"name": "m", "gpusPerInstance": 1},
            "throughput": {"A100": 1000},
            "regions": [{"pool": "p", "minInstances": 1, "maxInstances": 40}],
            "scaling": {"forecast": {"stepSeconds": int(STEP)}},
        },
    }
    return FleetView.of(
        pools=[ObjectRecord.from_body(pool_body)],
        model_deployments=[ObjectRecord.from_body(md_body)],
    )


async def test_the_operator_reports_a_stopped_history_as_forecast_fallback() -> None:
    book = PlanBook()
    planner = FleetPlanner(
        StoppedSeries(),  # type: ignore[arg-type]  # duck-typed: range_series only
        Autoscaler(),
        book,
        view,
        lambda key: None,
        clock=lambda: NOON,
    )
    try:
        assert await planner.plan_once()
    finally:
        planner.close()
    updates, _ = apply_plan_status(book, "ns/a", [{"pool": "p"}])
    forecast_healthy = next(u for u in updates if u.type == "ForecastHealthy")
    assert forecast_healthy.status is False
    assert forecast_healthy.reason == FORECAST_FALLBACK
    assert "arima" in forecast_healthy.message
    assert "stopped" in forecast_healthy.message
