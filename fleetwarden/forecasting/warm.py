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
  step or the regression shape changed, e.g. weekly terms switching on, or the reuse failed);
- the cached parameters no longer describe it: they fit the new window much worse than their own
  (`arima.MAX_REUSE_LLF_DROP`), or `arima.fit_arima` found them biased and could not re-optimise
  them (below).

When the cached parameters' one-step predictions of the last 6 hours all erred the same way
(`arima.MAX_REUSE_INNOVATION_BIAS`), their order is re-optimised starting from them, not the whole
grid (`reoptimisations` counts these). That is a level change such as the first weekend day before
weekly terms exist: parameters fitted before it or in its first hours revert the forecast to the
old level, and while the change is young each new fit is soon stale again, so it fires several
hours in a row (6 times on that day of the demo load). The order still fits (the likelihood check
passed); only its parameters lag. Replayed on the hourly rounds of a 7-day fluid run of the
built-in workload (5 series of one shape, 600 ARIMA rounds) and of ServeGen (3 models, 8 days at
10-minute steps, 579 rounds), against a fresh grid fit of every round:

| peak distance to fresh fits, worst / mean | no bias check | grid fit on bias | re-optimise |
|---|---|---|---|
| fluid, first weekend day (120 rounds) | 53.1 / 11.1% | 3.1 / 0.8% | 2.9 / 0.9% |
| ServeGen m-large, m-mid, m-small, worst | 10.1, 10.3, 9.6% | 10.1, 21.0, 3.1% | 10.1, 17.2, 6.0% |
| ServeGen, mean | 1.26, 1.11, 0.55% | 0.98, 0.94, 0.41% | 0.99, 0.82, 0.48% |
| grid fits (+ re-optimisations), fluid / ServeGen | 35 / 35 | 75 / 45 | 35 + 40 / 35 + 15 |

A re-optimisation costs 80-110 ms on the fluid run's 5-minute series (a grid fit 240-390 ms, a
reuse 10-14 ms) and 21 ms on ServeGen's 10-minute ones (grid 210 ms), so the replayed forecasting
CPU was 17 s (fluid) and 11 s (ServeGen) against 28 s and 15 s with grid fits and 14 s and 12 s
without the check (least of 5 runs on a shared 2-core machine). Its distance is not zero where
the grid would switch order on a near tie (ServeGen m-small's 6.0%: AR(1) kept, the grid takes
ARMA(2, 1) by 0.5 of AIC). The worst rounds of m-large and m-mid (m-mid: the load falling to 40%
in the 20 minutes before the round, under a fit of the previous day) are reuses neither check
refuses, and which ones they are depends on the schedule's phase (m-mid's worst without the check
is 10 to 30% over four phases, 21% with grid fits and 17% re-optimising in all four).

A fit made because the cached parameters were refused, by either check, is kept
`early_refit_keep_s` (6 h), not a day: it was made on a window that was still changing and can
itself go stale. On ServeGen one such grid fit, made by an evening change and kept a day,
forecast that night 24% above fresh fits; kept a day, re-optimised fits leave m-large's mean
distance at 1.29% instead of 0.99%.

Pure like the rest of `forecasting`: no clock (time is an argument), no I/O, and the cache lives in
the object the caller owns, so two runs that make the same calls get the same forecasts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass, field

from fleetwarden.forecasting.arima import REUSE_BIAS_WINDOW_S, ArmaParams
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
    early: bool
    """Fitted or re-optimised because the cached parameters were refused (`early_refit_keep_s`
    applies)."""


@dataclass
class WarmForecaster:
    """Forecasts per series key, refitting the ARMA parameters every `refit_every_s`.

    `refit_every_s = 0` fits fresh on every call (the forecasts are then exactly `forecast`'s);
    `math.inf` fits once per series and filters forever after, except after early refits.
    """

    refit_every_s: float = DAY_S
    early_refit_keep_s: float = REUSE_BIAS_WINDOW_S
    """How long a fit made (on the grid or re-optimised) because the cached parameters were
    refused is kept (at most `refit_every_s`): by then the window the innovation-bias check sums
    lies wholly after it."""
    on_fit: FitHook | None = None
    fit: FitFunction = forecast_with
    fits: int = field(default=0, init=False)
    """Fresh fits run (the order grid optimised), successful or not; `on_fit` is called for
    these only."""
    reuses: int = field(default=0, init=False)
    """ARIMA forecasts made with cached parameters."""
    reoptimisations: int = field(default=0, init=False)
    """Cached parameters refused for innovation bias and re-optimised for their own order (one
    optimisation started from them instead of the grid); the new ones are cached."""
    _cache: dict[Hashable, _Entry] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if math.isnan(self.refit_every_s) or self.refit_every_s < 0:
            raise ValueError(f"refit_every_s must be >= 0, got {self.refit_every_s!r}")
        if math.isnan(self.early_refit_keep_s) or self.early_refit_keep_s < 0:
            raise ValueError(f"early_refit_keep_s must be >= 0, got {self.early_refit_keep_s!r}")

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
        if entry is not None and entry.config == config:
            keep_s = self.refit_every_s
            if entry.early:
                keep_s = min(keep_s, self.early_refit_keep_s)
            if 0 <= now_s - entry.fitted_at_s < keep_s:
                reuse = entry.arma
        fitted = self.fit(series, config, reuse)
        if fitted.refitted:
            self.fits += 1
            if self.on_fit is not None:
                self.on_fit(key, now_s)
        if fitted.arma is None:
            self._cache.pop(key, None)
        elif fitted.refitted or fitted.reoptimised:
            self._cache[key] = _Entry(now_s, config, fitted.arma, early=reuse is not None)
            if fitted.reoptimised:
                self.reoptimisations += 1
        else:
            self.reuses += 1
        return fitted.forecast

    def keep_only(self, keys: Collection[Hashable]) -> int:
        """Drop the cached fits of every key not in `keys`; returns how many were dropped.

        The operator calls this (through `plan_round`) with the series of each round, so the
        fits of a deleted ModelDeployment or a region taken out of one do not stay for the life
        of the process: with `refit_every_s = inf` nothing else would ever remove them.
        """
        gone = [key for key in self._cache if key not in keys]
        for key in gone:
            del self._cache[key]
        return len(gone)

    @property
    def cached(self) -> int:
        """How many series have a cached fit (not `__len__`: an empty cache must stay truthy)."""
        return len(self._cache)

    def fitted_at(self, key: Hashable) -> float | None:
        """When `key`'s cached parameters were fitted; None when nothing is cached for it."""
        entry = self._cache.get(key)
        return None if entry is None else entry.fitted_at_s
