"""The simulator's ForecastPlanner: the production forecaster and ILP on simulated series.

Real: the fleet YAML loader, the forecaster (ARIMA with statsmodels) and HiGHS. Nothing mocked.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

os.environ.setdefault(
    "OPENBLAS_NUM_THREADS", "1"
)  # statsmodels on busy cores (docs/forecasting.md)

import pytest

from fleetwarden.cli import main
from fleetwarden.forecasting.series import Series
from fleetwarden.sim.forecast_planner import ForecastPlanner
from fleetwarden.sim.planning import HourlyPlanner, LoadHistory
from fleetwarden.sim.run import make_planner
from tests.sim.fleet_fixtures import model_yaml, pool_yaml, write_fleet

DAY = 86_400.0
STEP = 300.0


def diurnal_history(end_s: float, days: float) -> LoadHistory:
    """Tokens/s peaking at 12:00 (20,000) with a trough at 00:00 (2,000), 5-minute steps."""
    n = int(days * DAY / STEP)
    start = end_s - n * STEP
    values = tuple(
        11_000 - 9_000 * math.cos(2 * math.pi * ((start + i * STEP) % DAY) / DAY) for i in range(n)
    )
    return LoadHistory(Series(start, STEP, values), Series(start, STEP, (1000.0,) * n))


def test_targets_rise_with_the_load(tmp_path: Path) -> None:
    fleet = write_fleet(
        tmp_path, pool_yaml(gpus=64), model_yaml(regions=(("pool-a", 1, 30),), throughput=2000.0)
    )
    planner: HourlyPlanner = ForecastPlanner()
    key = ("ns/m", "pool-a")
    night = 3 * DAY + 1 * 3600.0  # planning 01:00-02:00, near the trough
    noon = 3 * DAY + 11 * 3600.0  # planning 11:00-12:00, up to the peak
    at_night = planner.plan(night, fleet, {key: diurnal_history(night, 2.5)}, {key: 5})[key]
    at_noon = planner.plan(noon, fleet, {key: diurnal_history(noon, 2.5)}, {key: 5})[key]
    assert at_night.forecast_tps is not None
    assert at_noon.forecast_tps is not None
    assert at_noon.target > at_night.target
    # About 20,000 tokens/s at the peak over 2,000 per instance, plus the NIW buffer: ~10-11.
    assert 9 <= at_noon.target <= 13
    assert at_night.target <= 3
    assert at_noon.target * 2000.0 >= at_noon.forecast_tps
    last = planner.last  # type: ignore[attr-defined]
    assert last.endpoints[key].forecast_model == "arima"


def test_no_history_keeps_the_current_count(tmp_path: Path) -> None:
    fleet = write_fleet(tmp_path, pool_yaml(), model_yaml(regions=(("pool-a", 1, 8),)))
    key = ("ns/m", "pool-a")
    empty = LoadHistory(Series(0.0, STEP, ()), Series(0.0, STEP, ()))
    planner = ForecastPlanner()
    assert planner.plan(3600.0, fleet, {}, {key: 4})[key].target == 4
    entry = planner.plan(3600.0, fleet, {key: empty}, {key: 3})[key]
    assert entry.target == 3
    assert entry.forecast_tps is None
    assert planner.last is not None
    assert planner.last.endpoints[key].held


def test_fits_once_a_day_and_reuses_the_parameters_in_between(tmp_path: Path) -> None:
    fleet = write_fleet(
        tmp_path, pool_yaml(gpus=64), model_yaml(regions=(("pool-a", 1, 30),), throughput=2000.0)
    )
    key = ("ns/m", "pool-a")
    first = 3 * DAY + 9 * 3600.0
    warm, fresh = ForecastPlanner(), ForecastPlanner(refit_every_s=0.0)
    for planner in (warm, fresh):
        for hour in range(3):
            now = first + hour * 3600.0
            planner.plan(now, fleet, {key: diurnal_history(now, 2.5)}, {key: 5})
            if hour == 0:  # the first round is a fresh fit either way
                assert planner.last is not None
                assert planner.last.endpoints[key].forecast_model == "arima"
    assert (warm.warm.fits, warm.warm.reuses) == (1, 2)
    assert (fresh.warm.fits, fresh.warm.reuses) == (3, 0)
    assert warm.last is not None
    assert fresh.last is not None
    warm_peak = warm.last.endpoints[key].region_peak_tps
    fresh_peak = fresh.last.endpoints[key].region_peak_tps
    assert warm_peak is not None
    assert fresh_peak is not None
    assert abs(warm_peak / fresh_peak - 1) < 0.05


def test_the_cli_passes_refit_hours_to_the_planner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    planner = make_planner("forecast", 6 * 3600.0)
    assert isinstance(planner, ForecastPlanner)
    assert planner.warm.refit_every_s == 6 * 3600.0
    examples = Path(__file__).resolve().parents[2] / "examples"
    args = ["simulate", "--fleet", str(examples), "--quiet", "--out", str(tmp_path)]
    assert main([*args, "--refit-hours", "-1"]) == 2
    assert "--refit-hours must be >= 0" in capsys.readouterr().err
