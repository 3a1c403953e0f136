"""The hourly load forecast: ARIMA with Fourier seasonality, and what to do when it cannot run.

`forecast(series)` never raises for a bad series. It picks the best model the history allows and
says which one, and why, in the returned `Forecast`:

| history (valid samples)                         | model            | fallback_reason      |
|-------------------------------------------------|------------------|----------------------|
| >= 2 days, not constant, the fit works          | `arima`          | None                 |
| < 2 days or ARIMA failed, yesterday has data    | `seasonal-naive` | why not ARIMA        |
| ... and yesterday's window is empty; constant   | `last-peak`      | why not the above    |
| no valid sample at all (empty, all NaN/inf/<0)  | `no-data`        | "no valid sample..." |

The operator treats anything but `arima` as a degraded forecast (`ForecastHealthy=False`) and
`no-data` as "hold replicas" (DESIGN section 5: never scale on missing data).

`forecast_with` is the same forecast, returning the fitted ARMA parameters too and optionally
reusing an earlier call's instead of optimising them again; `forecasting.warm` builds the
simulator's refit-once-a-day cache on it.

Pure: no clock, no I/O, no environment. Fit time is measured by the callers (the backtest, the
operator's timer); set `OPENBLAS_NUM_THREADS=1` in the process environment before numpy is imported,
statsmodels fits run 5-10x slower on busy cores otherwise (docs/forecasting.md).
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from fleetwarden.forecasting.arima import (
    ArimaFitError,
    ArimaSpec,
    ArmaParams,
    Order,
    fit_arima,
)
from fleetwarden.forecasting.fallbacks import SimplePath, hours, last_peak, seasonal_naive
from fleetwarden.forecasting.series import DAY_S, FloatArray, Series, clean

DEFAULT_ORDERS: tuple[Order, ...] = tuple((p, 0, q) for p in (1, 2) for q in (0, 1, 2))
"""ARMA(p, q) errors, p in 1..2, q in 0..2, chosen by AIC. On the ServeGen backtest (m-mid requests/s,
166 hours) the issue's 3x2x3 grid (adding d = 1 and p = 0) raised the peak MAPE from 10.0 to 10.6 %
at the same under-forecast rate and cost 1.2x the fit time: with the Fourier profile in the
regression the residual needs no differencing, AIC across d = 0 and d = 1 still picked d = 1 in a
third of the hours, and p = 0 only as a random walk (docs/forecasting.md)."""


class ForecastModel(enum.StrEnum):
    ARIMA = "arima"
    SEASONAL_NAIVE = "seasonal-naive"
    LAST_PEAK = "last-peak"
    NO_DATA = "no-data"


@dataclass(frozen=True)
class ForecastConfig:
    """Knobs of the forecast; defaults chosen by the ServeGen backtest (docs/forecasting.md)."""

    horizon_s: float = 3600.0
    """How far ahead: the planner runs hourly and provisions for the next hour's peak."""
    daily_terms: int = 4
    """Fourier pairs for the daily profile (K)."""
    weekly_terms: int = 3
    """Fourier pairs for the weekly profile, used only with `weekly_min_history_s` of history."""
    weekly_min_history_s: float = 14 * DAY_S
    """Two full cycles before a weekday effect is estimated, so one odd day is not a pattern."""
    arima_min_history_s: float = 2 * DAY_S
    """Valid observed time below which ARIMA is not tried: one day cannot separate the daily profile
    from that day's noise."""
    max_history_s: float = 28 * DAY_S
    """Older samples are ignored: four weeks give the weekly terms four cycles."""
    arma_history_s: float = 3 * DAY_S
    """The ARMA errors are fitted on this last stretch only: the fit cost grows with it, and the
    backtest scored 3 days as well as 7 (the peak calibration uses its last 2 days)."""
    orders: tuple[Order, ...] = DEFAULT_ORDERS
    peak_quantile: float = 0.6
    """Quantile of the past hour-ahead peak errors the planned peak covers (forecasting/peak.py):
    the realised peak should exceed the plan in about `1 - peak_quantile` of the hours."""
    min_calibration_blocks: int = 24
    """Past horizons needed to calibrate the peak empirically; with fewer, the peak is the max of
    the `peak_quantile` normal-theory path."""
    calibration_burn_in_s: float = DAY_S
    """The first day of the ARMA window is not used to calibrate: the filter is still settling."""
    band_coverage: float = 0.9
    """Probability inside [lower, upper] per step."""
    outlier_mads: float = 3.0
    """Hampel threshold for dropping isolated spikes from the fit; 0 disables it."""
    max_iterations: int = 50
    runaway_factor: float = 10.0
    """An ARIMA peak above this multiple of the largest observed sample is rejected as diverged."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.horizon_s) and self.horizon_s > 0):
            raise ValueError("horizon_s must be positive")
        if not 0.5 <= self.peak_quantile < 1:
            raise ValueError("peak_quantile must be in [0.5, 1)")
        if not 0 < self.band_coverage < 1:
            raise ValueError("band_coverage must be in (0, 1)")
        if not self.orders:
            raise ValueError("orders must not be empty")

    def arima_spec(self, weekly: bool) -> ArimaSpec:
        tail = (1.0 - self.band_coverage) / 2.0
        return ArimaSpec(
            orders=self.orders,
            daily_terms=self.daily_terms,
            weekly_terms=self.weekly_terms if weekly else 0,
            arma_history_s=self.arma_history_s,
            outlier_mads=self.outlier_mads,
            max_iterations=self.max_iterations,
            band_quantiles=(tail, 1.0 - tail),
            peak_quantile=self.peak_quantile,
            min_calibration_blocks=self.min_calibration_blocks,
            calibration_burn_in_s=self.calibration_burn_in_s,
        )


DEFAULT_CONFIG = ForecastConfig()


@dataclass(frozen=True)
class FitDiagnostics:
    n_input: int
    """Samples given (after trimming to `max_history_s`)."""
    n_points: int
    """Valid samples among them."""
    history_s: float
    """Observed time: valid samples times the step."""
    order: Order | None = None
    aic: float | None = None
    converged: bool | None = None
    candidates: int = 0
    """ARIMA orders that fitted; the chosen one has the lowest AIC among them."""
    daily_terms: int = 0
    weekly_terms: int = 0
    n_outliers: int = 0
    """Spikes left out of the fit by the Hampel filter."""
    calibration_blocks: int = 0
    """Past horizons the peak was calibrated on."""
    peak_ratio: float | None = None
    """Planned peak / max of the median path, from the calibration; None when not calibrated."""


@dataclass(frozen=True)
class Forecast:
    """The next `horizon` of load, step by step, and the peak to plan for."""

    start_s: float
    """Time of the first forecast step: the end of the input series."""
    step_s: float
    values: tuple[float, ...]
    """Median path, >= 0."""
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    """Band holding `band_coverage` of the probability at each step."""
    peak: float
    """Peak to plan for before the NIW buffer (`plan_peak` adds it)."""
    model: ForecastModel
    fallback_reason: str | None = None
    notes: tuple[str, ...] = ()
    diagnostics: FitDiagnostics = field(default_factory=lambda: FitDiagnostics(0, 0, 0.0))

    @property
    def healthy(self) -> bool:
        """True when the default model ran; the operator's `ForecastHealthy` condition."""
        return self.model is ForecastModel.ARIMA

    @property
    def has_data(self) -> bool:
        """False when there was nothing to forecast from: hold capacity, do not plan on 0."""
        return self.model is not ForecastModel.NO_DATA

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for status, Events and the CLI."""
        data = asdict(self)
        data["model"] = str(self.model)
        return data


def plan_peak(forecast: Forecast, niw_tokens_per_s_last_hour: float, beta: float = 0.10) -> float:
    """Tokens/s to provision for: forecast peak plus `beta` of last hour's NIW load (SageServe 6.3).

    The buffer absorbs transient bursts and leaves room to release queued NIW work. Non-finite or
    negative NIW load counts as 0: a broken NIW metric must not shrink the plan.
    """
    niw = niw_tokens_per_s_last_hour
    niw = niw if math.isfinite(niw) and niw > 0 else 0.0
    return forecast.peak + beta * niw


def forecast(series: Series, config: ForecastConfig = DEFAULT_CONFIG) -> Forecast:
    """Forecast the `config.horizon_s` after the end of `series`; never raises for bad values."""
    return forecast_with(series, config).forecast


@dataclass(frozen=True)
class Fitted:
    """A forecast and what a later call may reuse of it (`forecast_with`)."""

    forecast: Forecast
    arma: ArmaParams | None
    """The ARMA order and parameters behind an `arima` forecast; None for every fallback."""
    refitted: bool
    """The ARMA order grid was optimised in this call (the expensive step), successfully or not;
    False when the history never reached ARIMA or the reused parameters were enough."""
    reoptimised: bool = False
    """The reused parameters were refused for innovation bias and re-optimised for their own
    order only (`arima.fit_arima`): `arma` holds the new ones, and no grid was run."""


def forecast_with(
    series: Series, config: ForecastConfig = DEFAULT_CONFIG, reuse: ArmaParams | None = None
) -> Fitted:
    """`forecast`, optionally reusing an earlier fit's ARMA parameters (`arima.fit_arima`).

    The choice of model (no data, constant, short history) is made exactly as without `reuse`.
    A reuse that `fit_arima` refuses (fitted on another step or regression shape, e.g. before the
    weekly terms switched on at `weekly_min_history_s`; or no longer describing the series: a
    much worse likelihood, or one-step predictions persistently off after a level change that
    re-optimising their order could not fix), that fails or that runs away is retried as a fresh
    fit: a stale parameter set must never produce a fallback or a forecast that a fresh fit would
    have avoided. A reuse whose order was re-optimised returns `reoptimised=True` and the new
    parameters. Without `reuse` the result is exactly `forecast`'s.
    """
    trimmed = series.tail(config.max_history_s)
    horizon = max(1, math.ceil(config.horizon_s / series.step_s - 1e-9))
    cleaned = clean(trimmed.as_array())
    values = cleaned.values
    notes = list(cleaned.notes())
    if len(trimmed.values) < len(series.values):
        notes.append(f"used the last {hours(config.max_history_s)} of {hours(series.duration_s)}")
    diagnostics = FitDiagnostics(
        n_input=values.size,
        n_points=cleaned.n_valid,
        history_s=cleaned.n_valid * series.step_s,
    )
    build = _Builder(series.end_s, series.step_s, horizon, tuple(notes), diagnostics)

    if cleaned.n_valid == 0:
        reason = "empty series" if values.size == 0 else "no valid sample in the series"
        return Fitted(build.no_data(reason), None, False)
    valid = values[~np.isnan(values)]
    if float(valid.max()) == float(valid.min()):
        path = last_peak(values, series.step_s, horizon)
        assert path is not None  # at least one valid sample
        constant = build.simple(
            ForecastModel.LAST_PEAK, path, f"constant series ({valid[0]:g}): nothing to fit"
        )
        return Fitted(constant, None, False)
    if diagnostics.history_s < config.arima_min_history_s:
        reason = (
            f"{hours(diagnostics.history_s)} of valid history, ARIMA needs "
            f"{hours(config.arima_min_history_s)}"
        )
        return Fitted(_fallback(build, values, series.step_s, config, reason), None, False)

    first_valid = int(np.flatnonzero(~np.isnan(values))[0])
    weekly = (values.size - first_valid) * series.step_s >= config.weekly_min_history_s
    spec = config.arima_spec(weekly)
    try:
        fit = fit_arima(values, trimmed.timestamps(), series.step_s, horizon, spec, reuse)
    except ArimaFitError as exc:
        if reuse is not None:
            return forecast_with(series, config)
        return Fitted(
            _fallback(build, values, series.step_s, config, f"ARIMA failed: {exc}"), None, True
        )
    except Exception as exc:  # noqa: BLE001
        # The contract is "never raise into the caller for a bad series", and statsmodels and
        # numpy raise a wide, version-dependent set of errors on degenerate input. This is the one
        # boundary where they are all translated into a fallback with the error in the reason.
        if reuse is not None:
            return forecast_with(series, config)
        reason = f"ARIMA failed: {type(exc).__name__}: {exc}"
        return Fitted(_fallback(build, values, series.step_s, config, reason), None, True)

    peak = fit.peak
    ceiling = config.runaway_factor * float(valid.max())
    if not (math.isfinite(peak) and peak <= ceiling and np.all(np.isfinite(fit.upper))):
        if reuse is not None:
            return forecast_with(series, config)
        reason = f"ARIMA{fit.order} forecast ran away (peak {peak:g} > {ceiling:g})"
        return Fitted(_fallback(build, values, series.step_s, config, reason), None, True)
    fitted = FitDiagnostics(
        n_input=diagnostics.n_input,
        n_points=diagnostics.n_points,
        history_s=diagnostics.history_s,
        order=fit.order,
        aic=fit.aic,
        converged=fit.converged,
        candidates=fit.candidates,
        daily_terms=fit.daily_terms,
        weekly_terms=fit.weekly_terms,
        n_outliers=fit.n_outliers,
        calibration_blocks=fit.calibration.blocks,
        peak_ratio=fit.peak_ratio,
    )
    result = build.with_diagnostics(fitted).arima(fit.median, fit.lower, fit.upper, peak)
    if fit.reoptimised:
        note = f"ARIMA{fit.order} parameters re-optimised from an earlier fit's (warm start)"
        result = replace(result, notes=(*result.notes, note))
    elif reuse is not None:
        note = f"ARIMA{fit.order} parameters reused from an earlier fit (warm start)"
        result = replace(result, notes=(*result.notes, note))
    return Fitted(result, fit.arma, reuse is None, fit.reoptimised)


def _fallback(
    build: _Builder, values: FloatArray, step_s: float, config: ForecastConfig, reason: str
) -> Forecast:
    """Seasonal naive when yesterday's window has data, else the last observed peak."""
    path = seasonal_naive(values, step_s, build.horizon, config.band_coverage)
    if path is not None:
        return build.simple(ForecastModel.SEASONAL_NAIVE, path, reason)
    path = last_peak(values, step_s, build.horizon)
    assert path is not None  # callers checked there is a valid sample
    return build.simple(
        ForecastModel.LAST_PEAK, path, f"{reason}; no sample one day earlier for seasonal naive"
    )


@dataclass(frozen=True)
class _Builder:
    """Assembles `Forecast`s with the fields every branch shares."""

    start_s: float
    step_s: float
    horizon: int
    notes: tuple[str, ...]
    diagnostics: FitDiagnostics

    def with_diagnostics(self, diagnostics: FitDiagnostics) -> _Builder:
        return _Builder(self.start_s, self.step_s, self.horizon, self.notes, diagnostics)

    def arima(
        self, median: FloatArray, lower: FloatArray, upper: FloatArray, peak: float
    ) -> Forecast:
        return self._make(ForecastModel.ARIMA, median, lower, upper, peak, None)

    def simple(self, model: ForecastModel, path: SimplePath, reason: str) -> Forecast:
        forecast = self._make(
            model, path.values, path.lower, path.upper, float(path.values.max()), reason
        )
        if path.note:
            return replace(forecast, notes=(*forecast.notes, path.note))
        return forecast

    def no_data(self, reason: str) -> Forecast:
        zeros = np.zeros(self.horizon)
        return self._make(ForecastModel.NO_DATA, zeros, zeros, zeros, 0.0, reason)

    def _make(
        self,
        model: ForecastModel,
        values: FloatArray,
        lower: FloatArray,
        upper: FloatArray,
        peak: float,
        reason: str | None,
    ) -> Forecast:
        return Forecast(
            start_s=self.start_s,
            step_s=self.step_s,
            values=_as_tuple(values),
            # Quantile paths are monotone in the probability, but clipping and rounding can cross
            # them by an ulp; enforce lower <= values <= upper so consumers can rely on it.
            lower=_as_tuple(np.minimum(np.nan_to_num(lower, nan=0.0), values)),
            upper=_as_tuple(np.maximum(np.where(np.isfinite(upper), upper, values), values)),
            peak=float(peak),
            model=model,
            fallback_reason=reason,
            notes=self.notes,
            diagnostics=self.diagnostics,
        )


def _as_tuple(values: FloatArray) -> tuple[float, ...]:
    return tuple(float(v) for v in np.clip(values, 0.0, None))
