"""Rolling-origin backtest of the hourly peak forecast against two baselines.

Every `every_s` (an hour) from `warmup_s` after the start of the series, the forecaster sees only
the samples before that origin (optionally only the last `train_s` of them) and forecasts the next
`horizon_s`; its planned peak is compared with the realised peak of that window. The baselines are
what an operator without a model would do:

- persistence: the peak of the hour just before the origin;
- seasonal naive: the peak of the same window one day earlier.

An hour is scored only when the realised window and both baselines' windows hold at least one valid
sample and the realised peak is positive (an APE needs a non-zero denominator), so the three
forecasters are always compared on the same hours.

This module is a shell around the pure `forecast()`: it reads the clock (to report fit seconds),
which `forecast.py` must not.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from fleetwarden.forecasting.forecast import DEFAULT_CONFIG, Forecast, ForecastConfig, forecast
from fleetwarden.forecasting.series import DAY_S, Series, clean, window_max

Forecaster = Callable[[Series, ForecastConfig], Forecast]


@dataclass(frozen=True)
class PeakScore:
    """Accuracy of one forecaster's hourly peaks over the scored hours."""

    mape_pct: float
    """Mean absolute percentage error of the peak."""
    median_ape_pct: float
    under_forecast_rate_pct: float
    """Share of hours whose realised peak exceeded the forecast peak (capacity would fall short)."""

    @classmethod
    def of(cls, forecast_peaks: list[float], realised_peaks: list[float]) -> PeakScore:
        f = np.asarray(forecast_peaks, dtype=np.float64)
        r = np.asarray(realised_peaks, dtype=np.float64)
        if r.size == 0:
            return cls(math.nan, math.nan, math.nan)
        ape = np.abs(f - r) / r * 100.0
        return cls(
            mape_pct=float(ape.mean()),
            median_ape_pct=float(np.median(ape)),
            under_forecast_rate_pct=float(np.mean(r > f) * 100.0),
        )


@dataclass(frozen=True)
class HourResult:
    origin_s: float
    realised_peak: float
    forecast_peak: float
    persistence_peak: float
    seasonal_naive_peak: float
    model: str
    fit_s: float


@dataclass(frozen=True)
class BacktestResult:
    hours_evaluated: int
    hours_skipped: int
    """Origins left out because a window had no valid sample or the realised peak was 0 (hours
    left out by `max_hours` are not counted)."""
    step_s: float
    horizon_s: float
    train_days: float | None
    forecast: PeakScore
    persistence: PeakScore
    seasonal_naive: PeakScore
    mean_fit_s: float
    models: dict[str, int]
    """How many scored hours each forecast model produced (fallbacks show up here)."""
    hours: tuple[HourResult, ...]

    @property
    def beats_baselines(self) -> bool:
        """Lower MAPE than both baselines with an under-forecast rate no higher than either's."""
        f, p, s = self.forecast, self.persistence, self.seasonal_naive
        return f.mape_pct < min(p.mape_pct, s.mape_pct) and f.under_forecast_rate_pct <= min(
            p.under_forecast_rate_pct, s.under_forecast_rate_pct
        )

    def to_dict(self, with_hours: bool = False) -> dict[str, object]:
        data = asdict(self)
        data["beats_baselines"] = self.beats_baselines
        if not with_hours:
            del data["hours"]
        return data


def backtest(
    series: Series,
    config: ForecastConfig = DEFAULT_CONFIG,
    *,
    train_s: float | None = None,
    warmup_s: float = 2 * DAY_S,
    every_s: float = 3600.0,
    max_hours: int | None = None,
    forecaster: Forecaster = forecast,
    clock: Callable[[], float] = time.perf_counter,
) -> BacktestResult:
    """Score `forecaster` on `series`; `max_hours` keeps only the last N scorable origins.

    `warmup_s` (at least one day, for the seasonal-naive baseline) is history the first origin
    already has; the default of two days is the forecaster's own minimum for ARIMA.
    """
    step = series.step_s
    values = clean(series.as_array()).values
    horizon = max(1, math.ceil(config.horizon_s / step - 1e-9))
    day = round(DAY_S / step)
    every = max(1, round(every_s / step))
    first = max(math.ceil(max(warmup_s, DAY_S) / step - 1e-9), day, horizon)
    origins = list(range(first, values.size - horizon + 1, every))

    scorable: list[tuple[int, float, float, float]] = []
    for i in origins:
        realised = window_max(values, i, i + horizon)
        persistence = window_max(values, i - horizon, i)
        seasonal = window_max(values, i - day, i - day + horizon)
        if realised > 0 and math.isfinite(persistence) and math.isfinite(seasonal):
            scorable.append((i, realised, persistence, seasonal))
    skipped = len(origins) - len(scorable)
    if max_hours is not None:
        scorable = scorable[len(scorable) - max_hours :] if max_hours > 0 else []

    results: list[HourResult] = []
    for i, realised, persistence, seasonal in scorable:
        origin_s = series.start_s + i * step
        history = series.until(origin_s)
        if train_s is not None:
            history = history.tail(train_s)
        started = clock()
        predicted = forecaster(history, config)
        elapsed = clock() - started
        results.append(
            HourResult(
                origin_s=origin_s,
                realised_peak=realised,
                forecast_peak=predicted.peak,
                persistence_peak=persistence,
                seasonal_naive_peak=seasonal,
                model=str(predicted.model),
                fit_s=elapsed,
            )
        )

    realised_peaks = [h.realised_peak for h in results]
    return BacktestResult(
        hours_evaluated=len(results),
        hours_skipped=skipped,
        step_s=step,
        horizon_s=config.horizon_s,
        train_days=None if train_s is None else train_s / DAY_S,
        forecast=PeakScore.of([h.forecast_peak for h in results], realised_peaks),
        persistence=PeakScore.of([h.persistence_peak for h in results], realised_peaks),
        seasonal_naive=PeakScore.of([h.seasonal_naive_peak for h in results], realised_peaks),
        mean_fit_s=float(np.mean([h.fit_s for h in results])) if results else math.nan,
        models=dict(sorted(Counter(h.model for h in results).items())),
        hours=tuple(results),
    )
