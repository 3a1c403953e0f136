"""Warm-started forecasts: refit the ARIMA parameters on a schedule, filter in between.

A fresh forecast optimises a grid of ARMA orders (`arima._best_order`): about a second per series
on 3 days of 1-minute data. The operator plans once an hour per (model, region) and can afford
that; the simulator plans every simulated hour of a multi-day run for every (model, region), and
spends nearly all of its time there. Between refits the parameters barely move (they describe
minutes-scale autocorrelation of the residual around a daily profile), so a `WarmForecaster` keeps
the last fit's order and parameters per series and, until `refit_every_s` of (caller-given) time
has passed, only re-estimates the cheap regression and runs one Kalman filter pass over the new
residuals (`forecast.forecast_with(..., reuse=...)`). New observations still move the forecast:
the filtered state, the level and the daily profile come from the data of this round.

When it fits fresh regardless of the schedule:

- no cached fit for the series (first ARIMA round, including the round the history first grows
  long enough for ARIMA: fallback rounds leave nothing in the cache);
- the last round ended in a fallback (a failed fit is retried every round, as without a cache);
- the forecast config changed (another horizon or order grid), or the clock went backwards;
- the cached parameters cannot be used on the new series (`forecast_with` retries fresh when the
  step or the regression shape changed, e.g. weekly terms switching on, or the reuse failed).

Pure like the rest of `forecasting`: no clock (time is an argument), no I/O, and the cache lives in
the object the caller owns, so two runs that make the same calls get the same forecasts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from fleetwarden.forecasting.arima import ArmaParams
from fleetwarden.forecasting.forecast import (
    DEFAULT_CONFIG,
    Fitted,
    Forecast,
    ForecastConfig,
    forecast_with,
)
from fleetwarden.forecasting.series import DAY_S, Series

FitHook = Callable[[Hashable, float], None]
"""Called with (series key, now_s) every time a fresh fit is run: for tests and diagnostics."""
FitFunction = Callable[[Series, ForecastConfig, ArmaParams | None], Fitted]
"""`forecast.forecast_with`'s signature; replaceable so the schedule can be tested without ARIMA."""


@dataclass(frozen=True)
class _Entry:
    fitted_at_s: float
    config: ForecastConfig
    arma: ArmaParams


@dataclass
class WarmForecaster:
    """Forecasts per series key, refitting the ARMA parameters every `refit_every_s`.

    `refit_every_s = 0` fits fresh on every call (the forecasts are then exactly `forecast`'s);
    `math.inf` fits once per series and filters forever after.
    """

    refit_every_s: float = DAY_S
    on_fit: FitHook | None = None
    fit: FitFunction = forecast_with
    fits: int = field(default=0, init=False)
    """Fresh fits run (the order grid optimised), successful or not."""
    reuses: int = field(default=0, init=False)
    """ARIMA forecasts made with cached parameters."""
    _cache: dict[Hashable, _Entry] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if math.isnan(self.refit_every_s) or self.refit_every_s < 0:
            raise ValueError(f"refit_every_s must be >= 0, got {self.refit_every_s!r}")

    def forecast(
        self,
        key: Hashable,
        series: Series,
        config: ForecastConfig = DEFAULT_CONFIG,
        *,
        now_s: float,
    ) -> Forecast:
        """`forecast.forecast(series, config)`, reusing `key`'s cached fit while it is fresh."""
        entry = self._cache.get(key)
        reuse = None
        if (
            entry is not None
            and entry.config == config
            and 0 <= now_s - entry.fitted_at_s < self.refit_every_s
        ):
            reuse = entry.arma
        fitted = self.fit(series, config, reuse)
        if fitted.refitted:
            self.fits += 1
            if self.on_fit is not None:
                self.on_fit(key, now_s)
        if fitted.arma is None:
            self._cache.pop(key, None)
        elif fitted.refitted:
            self._cache[key] = _Entry(now_s, config, fitted.arma)
        else:
            self.reuses += 1
        return fitted.forecast

    def fitted_at(self, key: Hashable) -> float | None:
        """When `key`'s cached parameters were fitted; None when nothing is cached for it."""
        entry = self._cache.get(key)
        return None if entry is None else entry.fitted_at_s
