"""The forecaster: accuracy on a known diurnal load, every fallback, and never raising."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetwarden.forecasting.forecast import (
    Forecast,
    ForecastConfig,
    ForecastModel,
    forecast,
    plan_peak,
)
from fleetwarden.forecasting.series import DAY_S, Series

HOUR_S = 3600.0
# A small grid keeps the property tests fast; the default grid is exercised by the accuracy test.
FAST = ForecastConfig(orders=((1, 0, 0), (2, 0, 1)))


def diurnal(days: float, step_s: float, *, noise: float = 20.0, seed: int = 7) -> np.ndarray:
    """1000 +- 500 tokens/s over the day with peak at 14:00, plus seeded Gaussian noise."""
    t = np.arange(round(days * DAY_S / step_s)) * step_s
    rng = np.random.default_rng(seed)
    curve = 1000.0 + 500.0 * np.cos(2 * np.pi * (t - 14 * HOUR_S) / DAY_S)
    return np.asarray(curve + rng.normal(0.0, noise, t.size))


def assert_well_formed(f: Forecast, horizon_steps: int) -> None:
    assert len(f.values) == len(f.lower) == len(f.upper) == horizon_steps
    for lo, v, hi in zip(f.lower, f.values, f.upper, strict=True):
        assert math.isfinite(lo)
        assert math.isfinite(v)
        assert math.isfinite(hi)
        assert 0.0 <= lo <= v <= hi
    assert math.isfinite(f.peak)
    assert f.peak >= 0.0
    assert (f.fallback_reason is None) == (f.model is ForecastModel.ARIMA)


@pytest.mark.parametrize("origin_h", [11.0, 20.0])
def test_peak_of_a_diurnal_load_is_close_to_the_true_next_hour_peak(origin_h: float) -> None:
    step = 300.0
    full = diurnal(4 + (origin_h + 1) / 24, step)
    n_history = round((4 * DAY_S + origin_h * HOUR_S) / step)
    history = Series.of(full[:n_history], step_s=step)
    true_peak = float(full[n_history : n_history + 12].max())

    f = forecast(history)

    assert f.model is ForecastModel.ARIMA, f.fallback_reason
    assert_well_formed(f, 12)
    assert f.start_s == history.end_s
    assert f.peak == pytest.approx(true_peak, rel=0.08)
    assert f.diagnostics.order in ForecastConfig().orders
    assert f.diagnostics.weekly_terms == 0
    assert f.diagnostics.calibration_blocks >= ForecastConfig().min_calibration_blocks
    assert f.peak >= max(f.values) * 0.9


@pytest.mark.parametrize("scale", [1e-4, 1e3])
def test_forecast_does_not_depend_on_the_unit(scale: float) -> None:
    """tokens/s or kilotokens/s: the same forecast up to the scale (the log offset is relative)."""
    values = diurnal(3, 600.0)
    base = forecast(Series.of(values, step_s=600.0), FAST)
    scaled = forecast(Series.of(values * scale, step_s=600.0), FAST)
    assert scaled.diagnostics.order == base.diagnostics.order
    assert scaled.peak == pytest.approx(base.peak * scale, rel=1e-6)
    assert scaled.values == pytest.approx(tuple(v * scale for v in base.values), rel=1e-6)


def test_gaps_and_spikes_in_the_history_do_not_stop_arima() -> None:
    values = diurnal(3, 600.0)
    values[100:130] = np.nan  # a five-hour scrape outage
    values[200] = 50_000.0  # one batch client's burst
    values[250] = -3.0  # a broken counter subtraction
    f = forecast(Series.of(values, step_s=600.0), FAST)
    assert f.model is ForecastModel.ARIMA
    assert f.diagnostics.n_outliers >= 1
    assert f.peak < 5_000.0
    assert any("missing" in n for n in f.notes)
    assert any("negative" in n for n in f.notes)


def test_no_sample_at_all_is_no_data_with_a_zero_forecast() -> None:
    for series in (Series.of([]), Series.of([math.nan] * 50), Series.of([-1.0, math.inf])):
        f = forecast(series, FAST)
        assert f.model is ForecastModel.NO_DATA
        assert not f.has_data
        assert not f.healthy
        assert f.peak == 0.0
        assert f.fallback_reason


def test_constant_series_forecasts_the_constant() -> None:
    f = forecast(Series.of([42.0] * 2000, step_s=300.0), FAST)
    assert f.model is ForecastModel.LAST_PEAK
    assert f.values == (42.0,) * 12
    assert f.peak == 42.0
    assert "constant" in (f.fallback_reason or "")


def test_zeros_are_a_constant_series_not_an_error() -> None:
    f = forecast(Series.of([0.0] * 600, step_s=600.0), FAST)
    assert f.model is ForecastModel.LAST_PEAK
    assert f.peak == 0.0


def test_less_than_two_days_falls_back_to_seasonal_naive() -> None:
    values = diurnal(1.5, 300.0, noise=0.0)
    f = forecast(Series.of(values, step_s=300.0), FAST)
    assert f.model is ForecastModel.SEASONAL_NAIVE
    assert "ARIMA needs 48.0 h" in (f.fallback_reason or "")
    day = round(DAY_S / 300.0)
    expected = values[values.size - day : values.size - day + 12]
    assert f.values == pytest.approx(tuple(expected))
    assert f.peak == pytest.approx(float(expected.max()))


def test_less_than_a_day_falls_back_to_the_last_peak() -> None:
    values = [5.0, 9.0, 7.0] * 40  # 10 hours of 5-minute samples
    f = forecast(Series.of(values, step_s=300.0), FAST)
    assert f.model is ForecastModel.LAST_PEAK
    assert f.peak == 9.0
    assert f.values == (9.0,) * 12
    assert "no sample one day earlier" in (f.fallback_reason or "")


def test_last_peak_skips_an_outage_at_the_end() -> None:
    values = [1.0, 3.0, 2.0, 4.0] + [math.nan] * 6
    f = forecast(Series.of(values, step_s=600.0), FAST)
    assert f.model is ForecastModel.LAST_PEAK
    assert f.peak == 4.0
    assert any("60 min old" in n for n in f.notes)


def test_mostly_missing_history_is_judged_on_valid_samples() -> None:
    values = diurnal(3, 600.0)
    values[: values.size * 2 // 3] = np.nan  # one valid day out of three
    f = forecast(Series.of(values, step_s=600.0), FAST)
    assert f.model is ForecastModel.SEASONAL_NAIVE
    assert f.diagnostics.n_points == values.size // 3


def test_weekly_terms_only_with_two_weeks_of_history() -> None:
    hourly = diurnal(15, HOUR_S, noise=10.0)
    config = ForecastConfig(orders=((1, 0, 0),))
    short = forecast(Series.of(hourly[: 13 * 24], step_s=HOUR_S), config)
    long = forecast(Series.of(hourly, step_s=HOUR_S), config)
    assert short.model is long.model is ForecastModel.ARIMA
    assert short.diagnostics.weekly_terms == 0
    assert long.diagnostics.weekly_terms == config.weekly_terms > 0


def test_history_longer_than_the_maximum_is_trimmed_and_noted() -> None:
    config = ForecastConfig(orders=((1, 0, 0),), max_history_s=3 * DAY_S)
    f = forecast(Series.of(diurnal(5, HOUR_S), step_s=HOUR_S), config)
    assert f.diagnostics.n_input == 72
    assert any("used the last 72.0 h" in n for n in f.notes)


def test_plan_peak_adds_beta_of_the_niw_load() -> None:
    f = forecast(Series.of([100.0] * 10, step_s=300.0), FAST)
    assert plan_peak(f, 200.0) == pytest.approx(120.0)
    assert plan_peak(f, 200.0, beta=0.25) == pytest.approx(150.0)
    assert plan_peak(f, 0.0) == 100.0
    # A broken NIW metric must not shrink the plan.
    assert plan_peak(f, -50.0) == 100.0
    assert plan_peak(f, math.nan) == 100.0


def test_to_dict_is_json_ready() -> None:
    f = forecast(Series.of([1.0, 2.0], step_s=300.0), FAST)
    data = f.to_dict()
    assert data["model"] == "last-peak"
    assert set(data) >= {"values", "lower", "upper", "peak", "fallback_reason", "diagnostics"}


def test_invalid_configuration_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="peak_quantile"):
        ForecastConfig(peak_quantile=0.2)
    with pytest.raises(ValueError, match="horizon_s"):
        ForecastConfig(horizon_s=0.0)


_ANY_FLOAT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0.0, max_value=1e6),
    st.sampled_from([0.0, math.nan, -1.0]),
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
)
@given(
    values=st.lists(_ANY_FLOAT, max_size=150),
    step_s=st.sampled_from([600.0, 3600.0, 7200.0]),
    horizon_s=st.sampled_from([600.0, 3600.0, 5000.0]),
)
def test_any_series_gives_a_well_formed_forecast(
    values: list[float], step_s: float, horizon_s: float
) -> None:
    """Hourly and two-hourly steps reach the ARIMA branch with a few dozen samples."""
    config = ForecastConfig(orders=((1, 0, 0), (1, 0, 1)), horizon_s=horizon_s)
    f = forecast(Series.of(values, step_s=step_s), config)
    assert_well_formed(f, max(1, math.ceil(horizon_s / step_s)))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scale=st.floats(min_value=1e-6, max_value=1e9),
    bad=st.lists(st.integers(min_value=0, max_value=71), max_size=20),
    bad_value=st.sampled_from([math.nan, math.inf, -math.inf, -5.0, 0.0, 1e300]),
)
def test_scaled_diurnal_with_bad_samples_never_raises(
    scale: float, bad: list[int], bad_value: float
) -> None:
    values = diurnal(3, HOUR_S) / 1000.0 * scale
    values[bad] = bad_value
    f = forecast(Series.of(values, step_s=HOUR_S), FAST)
    assert_well_formed(f, 1)
    assert f.model in (ForecastModel.ARIMA, ForecastModel.SEASONAL_NAIVE)
