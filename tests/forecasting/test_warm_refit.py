"""Warm-started forecasts (`forecasting.warm`): refit on a schedule, filter in between.

Real ARIMA fits (statsmodels) on the built-in workload's daily cycle at 5-minute steps, except
for the schedule property, which replaces the fit function so it can try many schedules fast.
Fits are counted through the forecaster's counters and hook, never timed.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from fleetwarden.api.v1alpha1.regionpool import RegionPoolSpec
from fleetwarden.forecasting import arima
from fleetwarden.forecasting.arima import ArmaParams, Order
from fleetwarden.forecasting.forecast import (
    DEFAULT_CONFIG,
    Fitted,
    ForecastConfig,
    ForecastModel,
    forecast,
    forecast_with,
)
from fleetwarden.forecasting.hourly import (
    EndpointHistory,
    FleetSpecs,
    RoundInput,
    plan_round,
)
from fleetwarden.forecasting.series import DAY_S, Series
from fleetwarden.forecasting.warm import WarmForecaster
from fleetwarden.sim.workload_builtin import BuiltinWorkload

STEP = 300.0
HOUR = 3600.0
LEVEL = 10_000.0
"""Mean interactive tokens/s of the demo series."""
MAX_PEAK_DRIFT = 0.05
"""Warm peaks stay within 5% of a fresh fit's over a day without refit (measured: 3.6% worst)."""
MEAN_PEAK_DRIFT = 0.015
"""... and within 1.5% on average (measured: 0.8% over 24 hours, 1.0% over the hours tested)."""


def demo_values(days: float, seed: int = 0) -> np.ndarray:
    """The built-in workload's interactive cycle (RAGPulse's day, weekends at 0.7) at LEVEL,
    with gamma noise of 10% CV per 5-minute sample, from time 0 (a Monday, 00:00)."""
    workload = BuiltinWorkload()
    n = round(days * DAY_S / STEP)
    cycle = np.array([workload.cycle(i * STEP + STEP / 2, "r") for i in range(n)])
    noise = np.random.default_rng(seed).gamma(100.0, 1 / 100.0, n)
    return LEVEL * cycle * noise


DEMO = demo_values(5.0)


def history(end_s: float, values: np.ndarray = DEMO) -> Series:
    """The samples of `values` before `end_s`."""
    return Series(0.0, STEP, tuple(float(v) for v in values[: round(end_s / STEP)]))


T0 = 3 * DAY_S + 9 * HOUR
"""First planning round: Thursday 09:00, three days of history."""


def test_first_round_is_exactly_a_fresh_fit() -> None:
    warm = WarmForecaster()
    result = warm.forecast("k", history(T0), now_s=T0)
    assert result == forecast(history(T0))
    assert result.model is ForecastModel.ARIMA
    assert (warm.fits, warm.reuses, warm.fitted_at("k")) == (1, 0, T0)


def test_refits_on_schedule_and_reuses_in_between() -> None:
    calls: list[tuple[object, float]] = []
    warm = WarmForecaster(refit_every_s=6 * HOUR, on_fit=lambda key, now: calls.append((key, now)))
    for h in range(13):
        now = T0 + h * HOUR
        result = warm.forecast("k", history(now), now_s=now)
        assert result.model is ForecastModel.ARIMA
        reused = any("warm start" in note for note in result.notes)
        assert reused == (h % 6 != 0)
    assert calls == [("k", T0), ("k", T0 + 6 * HOUR), ("k", T0 + 12 * HOUR)]
    assert (warm.fits, warm.reuses) == (3, 10)


def test_zero_interval_fits_every_round_like_forecast() -> None:
    warm = WarmForecaster(refit_every_s=0.0)
    for h in range(2):
        now = T0 + h * HOUR
        assert warm.forecast("k", history(now), now_s=now) == forecast(history(now))
    assert (warm.fits, warm.reuses) == (2, 0)


def shifted_since_fit(factor: float, hours: int) -> np.ndarray:
    """DEMO with the `hours` after T0 (the hours since a fit at T0) multiplied by `factor`."""
    shifted = DEMO.copy()
    shifted[round(T0 / STEP) : round((T0 + hours * HOUR) / STEP)] *= factor
    return shifted


def test_a_level_shift_in_the_new_observations_moves_the_warm_forecast() -> None:
    now = T0 + 2 * HOUR
    peaks = {}
    for name, values in (("same", DEMO), ("shifted", shifted_since_fit(1.3, 2))):
        warm = WarmForecaster()
        warm.forecast("k", history(T0), now_s=T0)
        result = warm.forecast("k", history(now, values), now_s=now)
        assert (warm.fits, warm.reuses) == (1, 1)
        peaks[name] = result.peak
    assert peaks["shifted"] > 1.05 * peaks["same"]  # measured: 1.10


def test_a_larger_level_shift_reoptimises_the_kept_order() -> None:
    """+50% for the two hours since the fit: the kept parameters' one-step predictions of those
    hours all came in low (MAX_REUSE_INNOVATION_BIAS), so their own order is re-optimised from
    them instead of the whole grid (measured: ARMA(2, 2) both ways, peak within 0.001% of the
    fresh fit's)."""
    now = T0 + 2 * HOUR
    values = shifted_since_fit(1.5, 2)
    warm = WarmForecaster()
    kept = warm.forecast("k", history(T0), now_s=T0)
    result = warm.forecast("k", history(now, values), now_s=now)
    assert (warm.fits, warm.reuses, warm.reoptimisations) == (1, 0, 1)
    assert warm.fitted_at("k") == now
    assert any("re-optimised" in note for note in result.notes)
    assert result.diagnostics.order == kept.diagnostics.order
    assert result.peak == pytest.approx(forecast(history(now, values)).peak, rel=1e-3)


def test_a_biased_reuse_goes_to_the_grid_when_it_cannot_be_reoptimised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The order grid is the fallback when the re-optimisation fails (here: made to fail) and
    when the likelihood check refused the reuse before the bias was looked at."""
    series = history(T0 + 2 * HOUR, shifted_since_fit(1.5, 2))
    kept = forecast_with(history(T0)).arma
    assert kept is not None
    fresh = forecast_with(series)
    worse_than_fitted = replace(kept, llf_per_obs=kept.llf_per_obs + 1.0)
    assert forecast_with(series, DEFAULT_CONFIG, worse_than_fitted) == fresh

    fit_one = arima._fit_one

    def no_warm_start(
        residual: np.ndarray, order: Order, iterations: int, **kwargs: object
    ) -> object:
        return (
            None if kwargs.get("start_params") is not None else fit_one(residual, order, iterations)
        )

    monkeypatch.setattr(arima, "_fit_one", no_warm_start)
    assert forecast_with(series, DEFAULT_CONFIG, kept) == fresh


def test_warm_peaks_stay_close_to_fresh_fits_over_a_day() -> None:
    """The parameter drift of a day without refit, on the demo workload (every 3rd hour).

    Measured over all 24 hours: 0.8% mean, 3.6% worst (17:00, the evening drop, where the fresh
    fit switched from ARMA(2, 2) to ARMA(1, 1): fresh fits an hour apart differ as much); the
    cached fit's likelihood fell by at most 0.07 nats per sample, so no early refit."""
    warm = WarmForecaster()
    drifts = []
    for h in range(24):
        now = T0 + h * HOUR
        warm_result = warm.forecast("k", history(now), now_s=now)
        if h % 3 == 2:
            fresh = forecast(history(now))
            assert warm_result.model is fresh.model is ForecastModel.ARIMA
            drifts.append(abs(warm_result.peak / fresh.peak - 1.0))
    assert (warm.fits, warm.reuses) == (1, 23)
    assert max(drifts) < MAX_PEAK_DRIFT
    assert float(np.mean(drifts)) < MEAN_PEAK_DRIFT


WEEK = demo_values(7.0)
"""The demo load over a whole week: DEMO's five weekdays (the same samples), then the weekend at
0.7 of the weekday level. Under 14 days of history there are no weekly terms, so the daily
profile stays at the weekday level and the ARMA errors carry the weekend's drop."""
SATURDAY = 5 * DAY_S
MAX_WEEKEND_DRIFT = 0.06
"""Warm peaks on the first weekend day stay within 6% of a fresh fit's, compared at the odd hours
(measured over every hour not fitted on the grid: 2.7% worst, 0.5% mean, 1.3% worst at the odd
hours; without the innovation-bias check 19% worst and 10% mean, so this test fails by 19%)."""
MAX_WEEKEND_GRID_FITS = 3
"""Order-grid fits in those 22 rounds (measured: 2, the first and one when the last early fit's 6
hours were up; the check's 6 refusals, at 03:00 to 07:00 and 11:00, re-optimise the kept order
instead: with grid fits there, as before, this was 8)."""


def test_warm_peaks_stay_close_to_fresh_fits_on_the_first_weekend_day() -> None:
    """A fit made 2 hours into the weekend's drop (Saturday 02:00) has an AR root of 0.93 where
    fresh fits later that day reach 0.98: kept, it pulls the forecast back to the weekday level
    within the hour and forecast up to 19% above fresh fits (the likelihood check does not
    notice). The kept parameters' one-step predictions then all err high, and the
    innovation-bias check re-optimises them until they have seen enough of the new level."""
    warm = WarmForecaster()
    drifts = []
    for h in range(2, 24):
        now = SATURDAY + h * HOUR
        result = warm.forecast("k", history(now, WEEK), now_s=now)
        assert result.model is ForecastModel.ARIMA
        warm_started = any("warm start" in note for note in result.notes)
        if warm_started and h % 2 == 1:  # every other hour: a fresh fit costs 0.5 s
            drifts.append(abs(result.peak / forecast(history(now, WEEK)).peak - 1.0))
    assert len(drifts) >= 5
    assert max(drifts) < MAX_WEEKEND_DRIFT
    assert warm.fits + warm.reoptimisations + warm.reuses == 22
    assert warm.fits <= MAX_WEEKEND_GRID_FITS
    assert warm.reoptimisations >= 3


def test_ordinary_weekdays_keep_the_daily_schedule() -> None:
    """Hourly rounds from Wednesday 02:00 (two days of history) to Friday 23:00: one fit a day,
    as without the innovation-bias check (measured: no extra fit; the largest bias was 1.5 of
    the 3 allowed)."""
    fitted_at: list[float] = []
    warm = WarmForecaster(on_fit=lambda _key, now: fitted_at.append(now))
    start = 2 * DAY_S + 2 * HOUR
    for h in range(70):
        now = start + h * HOUR
        assert warm.forecast("k", history(now, WEEK), now_s=now).model is ForecastModel.ARIMA
    assert fitted_at[0] == start
    assert warm.fits + warm.reuses == 70
    assert warm.fits <= 3 + 1  # the three scheduled fits, and at most one extra in three days


def test_deterministic_across_runs() -> None:
    def run() -> list[object]:
        warm = WarmForecaster(refit_every_s=2 * HOUR)
        return [warm.forecast("k", history(T0 + h * HOUR), now_s=T0 + h * HOUR) for h in range(4)]

    assert run() == run()


def test_short_history_falls_back_then_fits_fresh_once_long_enough() -> None:
    warm = WarmForecaster()
    short = 1.5 * DAY_S
    result = warm.forecast("k", history(short), now_s=short)
    assert result == forecast(history(short))
    assert result.model is ForecastModel.SEASONAL_NAIVE
    assert (warm.fits, warm.fitted_at("k")) == (0, None)
    first = 2 * DAY_S + HOUR  # the first round with 2 days of valid history
    assert warm.forecast("k", history(first), now_s=first) == forecast(history(first))
    assert (warm.fits, warm.fitted_at("k")) == (1, first)


def test_a_failed_fit_falls_back_as_before_and_is_retried_every_round() -> None:
    # A runaway ceiling below the data makes every ARIMA forecast "run away": the fit runs and
    # fails, exactly the fallback path a statsmodels failure takes.
    config = replace(DEFAULT_CONFIG, runaway_factor=0.5)
    warm = WarmForecaster()
    for h in range(2):
        now = T0 + h * HOUR
        result = warm.forecast("k", history(now), config, now_s=now)
        assert result == forecast(history(now), config)
        assert result.model is ForecastModel.SEASONAL_NAIVE
        assert "ran away" in (result.fallback_reason or "")
    assert (warm.fits, warm.reuses, warm.fitted_at("k")) == (2, 0, None)


def test_config_change_or_time_going_back_refits() -> None:
    warm = WarmForecaster()
    warm.forecast("k", history(T0), now_s=T0)
    longer = ForecastConfig(horizon_s=2 * HOUR)
    now = T0 + HOUR
    assert warm.forecast("k", history(now), longer, now_s=now) == forecast(history(now), longer)
    assert warm.fits == 2
    assert warm.forecast("k", history(T0), longer, now_s=T0) == forecast(history(T0), longer)
    assert (warm.fits, warm.reuses) == (3, 0)


def test_unusable_parameters_are_refitted_fresh() -> None:
    series = history(T0)
    fresh = forecast_with(series)
    assert fresh.arma is not None
    assert fresh.refitted
    broken = replace(fresh.arma, params=tuple(math.nan for _ in fresh.arma.params))
    other_shape = replace(fresh.arma, weekly_terms=fresh.arma.weekly_terms + 1)
    # Parameters that explained their own window 1 nat per sample better than they explain this
    # one: the series changed in a way they cannot absorb (MAX_REUSE_LLF_DROP).
    worse_than_fitted = replace(fresh.arma, llf_per_obs=fresh.arma.llf_per_obs + 1.0)
    for reuse in (broken, other_shape, worse_than_fitted):
        retried = forecast_with(series, DEFAULT_CONFIG, reuse)
        assert retried == fresh


def test_plan_round_first_round_matches_and_later_rounds_reuse() -> None:
    fleet = FleetSpecs(
        pools={
            "p": RegionPoolSpec.model_validate(
                {"region": "r", "gpuType": "H100", "costPerHour": 4.0, "capacity": {"gpus": 64}}
            )
        },
        model_deployments={
            "ns/a": ModelDeploymentSpec.model_validate(
                {
                    "model": {"name": "a", "gpusPerInstance": 1},
                    "throughput": {"H100": 2000.0},
                    "regions": [{"pool": "p", "minInstances": 1, "maxInstances": 30}],
                }
            )
        },
    )

    def round_at(now: float, warm: WarmForecaster | None) -> tuple[object, object]:
        histories = {("ns/a", "p"): EndpointHistory(history(now))}
        result = plan_round(RoundInput(fleet, histories, {}, now_s=now), warm=warm)
        return result.forecasts, {k: e.target for k, e in result.endpoints.items()}

    warm = WarmForecaster()
    assert round_at(T0, warm) == round_at(T0, None)
    forecasts, _ = round_at(T0 + HOUR, warm)
    assert (warm.fits, warm.reuses) == (1, 1)
    assert forecasts[("ns/a", "r")].forecast.model is ForecastModel.ARIMA  # type: ignore[index]


def test_rejects_a_negative_interval() -> None:
    with pytest.raises(ValueError, match="refit_every_s"):
        WarmForecaster(refit_every_s=-1.0)
    with pytest.raises(ValueError, match="early_refit_keep_s"):
        WarmForecaster(early_refit_keep_s=math.nan)


# -- the schedule, with a stand-in fit -------------------------------------------------------------

STUB_ARMA = ArmaParams((1, 0, 0), (0.5,), True, True, 1, STEP, 0, 1.0)
STUB_SERIES = Series.of([1.0, 2.0], step_s=STEP)
STUB_FORECAST = forecast(STUB_SERIES)


def stub_fit(series: Series, config: ForecastConfig, reuse: ArmaParams | None) -> Fitted:
    """Every call is an ARIMA forecast; a fit when nothing is reused."""
    return Fitted(STUB_FORECAST, STUB_ARMA, reuse is None)


@pytest.mark.parametrize("refusal", ["grid fit", "re-optimised"])
def test_a_fit_forced_by_refused_parameters_is_kept_for_early_refit_keep_s_only(
    refusal: str,
) -> None:
    """The third call's reuse is refused (as `forecast_with` does for a worse-fitting reuse, with
    a grid fit, or a biased one, re-optimised): that early fit is reused for 6 hours, then
    refitted and kept the usual day."""
    calls: list[ArmaParams | None] = []

    def refuse_third(series: Series, config: ForecastConfig, reuse: ArmaParams | None) -> Fitted:
        calls.append(reuse)
        if len(calls) == 3 and refusal == "re-optimised":
            return Fitted(STUB_FORECAST, replace(STUB_ARMA, params=(0.9,)), False, True)
        return Fitted(STUB_FORECAST, STUB_ARMA, reuse is None or len(calls) == 3)

    fitted_at: list[float] = []
    warm = WarmForecaster(on_fit=lambda _key, now: fitted_at.append(now), fit=refuse_third)
    for h in range(12):
        warm.forecast("k", STUB_SERIES, now_s=h * HOUR)
    early = refusal == "re-optimised"
    assert fitted_at == ([0.0, 8 * HOUR] if early else [0.0, 2 * HOUR, 8 * HOUR])
    assert (warm.fits, warm.reoptimisations, warm.reuses) == (3 - early, int(early), 9)
    assert calls[3] == (replace(STUB_ARMA, params=(0.9,)) if early else STUB_ARMA)


@settings(max_examples=200, deadline=None)
@given(
    gaps_h=st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=40),
    refit_h=st.integers(min_value=0, max_value=48),
)
def test_fits_happen_exactly_when_the_cached_fit_is_refit_every_old(
    gaps_h: list[int], refit_h: int
) -> None:
    """Invariant: a round fits iff no fit is cached or the cached one is >= refit_every_s old;
    so consecutive fits are >= refit_every_s apart and every round is one or the other."""
    fitted_at: list[float] = []
    warm = WarmForecaster(
        refit_every_s=refit_h * HOUR, on_fit=lambda _key, now: fitted_at.append(now), fit=stub_fit
    )
    now, last = 0.0, None
    for gap in gaps_h:
        now += gap * HOUR
        warm.forecast("k", STUB_SERIES, now_s=now)
        if last is None or now - last >= refit_h * HOUR:
            last = now
        assert warm.fitted_at("k") == last
    assert all(b - a >= refit_h * HOUR for a, b in itertools.pairwise(fitted_at))
    assert warm.fits + warm.reuses == len(gaps_h)


def test_keep_only_drops_the_fits_of_series_no_longer_planned() -> None:
    warm = WarmForecaster(refit_every_s=math.inf, fit=stub_fit)
    for key in ("a", "b", "c"):
        warm.forecast(key, STUB_SERIES, now_s=0.0)
    assert warm.keep_only({"a", "c"}) == 1
    assert (warm.cached, warm.fitted_at("b"), warm.fitted_at("a")) == (2, None, 0.0)
    warm.forecast("b", STUB_SERIES, now_s=HOUR)  # back again: fitted fresh, not from a stale fit
    assert warm.fits == 4


def test_plan_round_forgets_a_deleted_model_deployment() -> None:
    """A long-lived operator with `refit_every_s = inf` plans a fleet whose ModelDeployment is
    then deleted: its fit must go with it, not stay cached for the life of the process."""
    pool = RegionPoolSpec.model_validate(
        {"region": "r", "gpuType": "H100", "costPerHour": 4.0, "capacity": {"gpus": 64}}
    )

    def deployment(name: str) -> ModelDeploymentSpec:
        return ModelDeploymentSpec.model_validate(
            {
                "model": {"name": name, "gpusPerInstance": 1},
                "throughput": {"H100": 2000.0},
                "regions": [{"pool": "p", "minInstances": 1, "maxInstances": 30}],
            }
        )

    warm = WarmForecaster(refit_every_s=math.inf, fit=stub_fit)
    both = FleetSpecs(
        pools={"p": pool},
        model_deployments={"ns/a": deployment("a"), "ns/b": deployment("b")},
    )
    histories = {(key, "p"): EndpointHistory(history(T0)) for key in ("ns/a", "ns/b")}
    plan_round(RoundInput(both, histories, {}, now_s=T0), warm=warm)
    assert warm.cached == 2
    one = FleetSpecs(pools={"p": pool}, model_deployments={"ns/a": deployment("a")})
    plan_round(RoundInput(one, {("ns/a", "p"): histories[("ns/a", "p")]}, {}, now_s=T0), warm=warm)
    assert (warm.cached, warm.fitted_at(("ns/b", "r"))) == (1, None)
    assert warm.fitted_at(("ns/a", "r")) == T0
