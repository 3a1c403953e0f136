"""The rolling-origin backtest's metrics on a series small enough to score by hand, and its CLI."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from fleetwarden.cli import forecast as forecast_cli
from fleetwarden.forecasting.backtest import Forecaster, PeakScore, backtest
from fleetwarden.forecasting.forecast import Forecast, ForecastConfig, ForecastModel
from fleetwarden.forecasting.series import DAY_S, Series
from fleetwarden.forecasting.series_io import (
    SeriesFileError,
    infer_step,
    read_series_csv,
    write_series_csv,
)

HOUR_S = 3600.0

# One sample per hour, so an hour's peak is its single value. Hours 3..22 are a flat 10.
#   origin 24: realised 10, persistence v[23] = 10, seasonal naive v[0] = 8
#   origin 25: realised 15, persistence v[24] = 10, seasonal naive v[1] = 12
#   origin 26: realised 10, persistence v[25] = 15, seasonal naive v[2] = 20
#   origin 27: realised NaN -> skipped
TINY = [8.0, 12.0, 20.0] + [10.0] * 21 + [10.0, 15.0, 10.0, math.nan]


def constant_forecaster(peak: float) -> Forecaster:
    def forecaster(history: Series, config: ForecastConfig) -> Forecast:
        return Forecast(
            start_s=history.end_s,
            step_s=history.step_s,
            values=(peak,),
            lower=(peak,),
            upper=(peak,),
            peak=peak,
            model=ForecastModel.LAST_PEAK,
            fallback_reason="stub",
        )

    return forecaster


def ticking_clock() -> Callable[[], float]:
    """Each call advances 0.25 s: every forecast "takes" 0.25 s, no real clock involved."""
    now = [0.0]

    def clock() -> float:
        now[0] += 0.25
        return now[0]

    return clock


def test_golden_metrics_of_both_baselines_and_a_constant_forecast() -> None:
    result = backtest(
        Series.of(TINY, step_s=HOUR_S),
        warmup_s=DAY_S,
        forecaster=constant_forecaster(12.0),
        clock=ticking_clock(),
    )
    assert result.hours_evaluated == 3
    assert result.hours_skipped == 1
    # Persistence APEs: 0, 5/15, 5/10; under-forecast only at origin 25.
    assert result.persistence.mape_pct == pytest.approx((0 + 100 / 3 + 50) / 3)
    assert result.persistence.median_ape_pct == pytest.approx(100 / 3)
    assert result.persistence.under_forecast_rate_pct == pytest.approx(100 / 3)
    # Seasonal naive APEs: 2/10, 3/15, 10/10; under-forecast at origins 24 and 25.
    assert result.seasonal_naive.mape_pct == pytest.approx((20 + 20 + 100) / 3)
    assert result.seasonal_naive.median_ape_pct == pytest.approx(20.0)
    assert result.seasonal_naive.under_forecast_rate_pct == pytest.approx(200 / 3)
    # A constant 12: APEs 2/10, 3/15, 2/10; under-forecast at origin 25 (15 > 12).
    assert result.forecast.mape_pct == pytest.approx(20.0)
    assert result.forecast.median_ape_pct == pytest.approx(20.0)
    assert result.forecast.under_forecast_rate_pct == pytest.approx(100 / 3)
    assert result.mean_fit_s == pytest.approx(0.25)
    assert result.models == {"last-peak": 3}
    assert result.beats_baselines
    assert [h.origin_s for h in result.hours] == [24 * HOUR_S, 25 * HOUR_S, 26 * HOUR_S]


def test_a_forecaster_that_under_forecasts_more_does_not_beat_the_baselines() -> None:
    result = backtest(
        Series.of(TINY, step_s=HOUR_S), warmup_s=DAY_S, forecaster=constant_forecaster(10.0)
    )
    # APEs 0, 1/3, 0: lower MAPE than both, but under-forecast 1/3 is not above persistence's...
    assert result.forecast.mape_pct == pytest.approx(100 / 9)
    assert result.forecast.under_forecast_rate_pct == pytest.approx(100 / 3)
    assert result.beats_baselines
    # ...while a forecast of 9 misses every hour.
    worse = backtest(
        Series.of(TINY, step_s=HOUR_S), warmup_s=DAY_S, forecaster=constant_forecaster(9.0)
    )
    assert worse.forecast.under_forecast_rate_pct == 100.0
    assert not worse.beats_baselines


def test_max_hours_keeps_the_last_scorable_hours_and_train_days_trims_history() -> None:
    seen: list[int] = []

    def recording(history: Series, config: ForecastConfig) -> Forecast:
        seen.append(len(history.values))
        return constant_forecaster(12.0)(history, config)

    result = backtest(
        Series.of(TINY, step_s=HOUR_S),
        warmup_s=DAY_S,
        max_hours=2,
        train_s=6 * HOUR_S,
        forecaster=recording,
    )
    assert [h.origin_s for h in result.hours] == [25 * HOUR_S, 26 * HOUR_S]
    assert result.hours_skipped == 1  # the NaN hour; hours cut by max_hours are not "skipped"
    assert seen == [6, 6]
    assert result.train_days == pytest.approx(0.25)


def test_peak_score_of_no_hours_is_nan() -> None:
    score = PeakScore.of([], [])
    assert math.isnan(score.mape_pct)
    assert math.isnan(score.under_forecast_rate_pct)


def test_csv_round_trip_keeps_gaps(tmp_path: Path) -> None:
    series = Series.of([1.0, math.nan, 3.5], start_s=600.0, step_s=300.0)
    path = tmp_path / "s.csv"
    write_series_csv(series, path)
    assert path.read_text().splitlines()[0] == "timestamp_s,value"
    back = read_series_csv(path)
    assert back.start_s == 600.0
    assert back.step_s == 300.0
    assert back.values[0] == 1.0
    assert math.isnan(back.values[1])
    assert back.values[2] == 3.5


def test_points_snap_to_the_grid_with_missing_slots_as_nan() -> None:
    s = Series.from_points([0.0, 610.0, 1790.0, 1795.0], [1.0, 2.0, 3.0, 5.0], step_s=600.0)
    assert s.values[:2] == (1.0, 2.0)
    assert s.values[2] == 4.0
    assert infer_step([0.0, 600.0, 1200.0, 1200.0, 2400.0]) == 600.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("time,value\n0,1\n", "missing column(s) timestamp_s"),
        ("timestamp_s,value\n", "no data rows"),
        ("timestamp_s,value\nnoon,1\n", ":2: timestamp_s 'noon' is not a number"),
        ("timestamp_s,value\n0,lots\n", ":2: value 'lots' is not a number"),
    ],
)
def test_bad_csv_is_an_error_naming_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(SeriesFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_series_csv(path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetwarden")
    forecast_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


def _run(*argv: str) -> int:
    args = _parser().parse_args(list(argv))
    code: int = args.func(args)
    return code


def _hourly_csv(tmp_path: Path, days: float = 3.0) -> Path:
    t = np.arange(round(days * 24)) * HOUR_S
    rng = np.random.default_rng(3)
    values = 100 + 40 * np.sin(2 * np.pi * t / DAY_S) + rng.normal(0, 3, t.size)
    path = tmp_path / "hourly.csv"
    write_series_csv(Series.of(values, step_s=HOUR_S), path)
    return path


def test_cli_backtest_prints_the_json_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _hourly_csv(tmp_path)
    assert _run("forecast", "backtest", "--series", str(path), "--hours", "3", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hours_evaluated"] == 3
    assert data["step_s"] == HOUR_S
    for key in ("forecast", "persistence", "seasonal_naive"):
        assert set(data[key]) == {"mape_pct", "median_ape_pct", "under_forecast_rate_pct"}
    assert {"mean_fit_s", "models", "beats_baselines", "hours_skipped"} <= set(data)
    assert "hours" not in data


def test_cli_backtest_text_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _hourly_csv(tmp_path)
    assert _run("forecast", "backtest", "--series", str(path), "--hours", "1") == 0
    out = capsys.readouterr().out
    assert "persistence" in out
    assert "seasonal naive" in out
    assert "beats both baselines" in out


@pytest.mark.parametrize(
    ("setup", "extra", "message"),
    [
        ("missing", (), "No such file"),
        ("columns", (), "missing column(s)"),
        ("short", (), "no hour to evaluate"),
        ("good", ("--step", "0"), "--step must be positive"),
        ("good", ("--horizon", "-5"), "--horizon must be positive"),
        ("good", ("--step", "1e-9"), "need more than 5,000,000 samples"),
        ("stray", (), "need more than 5,000,000 samples"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    setup: str,
    extra: tuple[str, ...],
    message: str,
) -> None:
    path = tmp_path / "series.csv"
    if setup == "columns":
        path.write_text("ts,v\n0,1\n")
    elif setup == "short":
        path.write_text("timestamp_s,value\n0,1\n3600,2\n")
    elif setup == "stray":  # one timestamp in the wrong unit made a grid of 3e12 samples
        path.write_text("timestamp_s,value\n0,1\n300,1\n600,1\n1e15,1\n")
    elif setup == "good":
        path = _hourly_csv(tmp_path)
    assert _run("forecast", "backtest", "--series", str(path), *extra) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
    assert err.startswith("fleetwarden forecast backtest: ")
