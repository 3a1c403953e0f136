"""ARIMA with Fourier seasonality, fitted in two stages so that an AIC grid costs seconds.

1. The load is taken as `log(load + offset)` (load varies multiplicatively: a burst doubles it,
   whatever the hour) and standardised. The offset, a small fraction of the median load, keeps
   zeros finite and makes the forecast independent of the unit: tokens/s, kilotokens/s and
   requests/s give the same forecast up to the scale.
2. Isolated spikes (a Hampel filter: a sample further than `outlier_mads` robust deviations from
   the median of its `+-3` neighbours) are marked missing *for fitting only*. One batch client's
   burst otherwise inflates the fitted variance and drags the ARMA level up for the next hour; the
   peak quantile, calibrated by backtest, is what covers bursts.
3. Daily (and, with two weeks of history, weekly) Fourier terms are fitted by least squares over
   the whole history: seasonality is a regression, cheap however long the history.
4. An ARMA(p, d, q) for the regression residuals is chosen by AIC over a small grid, fitted by
   statsmodels' state-space SARIMAX on the last `arma_history_s` only (short-memory dynamics need
   no more). The Kalman filter treats NaN as missing, so gaps need no imputation.

A fit can be *reused* (`fit_arima(..., reuse=fit.arma)`): steps 1-3 run again on the new history
(they cost milliseconds), but step 4 runs the Kalman filter once with the earlier fit's order and
parameters instead of optimising the whole order grid. The simulator, which plans every simulated
hour, uses that between daily refits (`forecasting.warm`); the operator fits fresh every hour.
A reuse is refused, so that the caller fits fresh, when the kept parameters explain the new window
much worse than their own (`MAX_REUSE_LLF_DROP`). When instead their one-step predictions of the
last hours were persistently off in one direction (`MAX_REUSE_INNOVATION_BIAS`: a level change
that short-memory parameters fitted before it keep pulling the forecast back from), the kept
order is re-optimised from them, one optimisation instead of the grid's six (`_reuse`).

Estimating the regression and the ARMA errors separately instead of jointly costs little accuracy
(both are consistent) and removes 2K parameters from every likelihood optimisation: measured here
on two busy cores, a whole forecast with the default 6-order grid takes 1.1-1.4 s on 7 days of
10-minute data and 2.3-3.1 s on 5-minute data, where the issue measured one joint ARIMA(2,0,1) with
K = 2..6 at 1.7-3.1 s (docs/forecasting.md, "Fit times").
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from statsmodels.tsa.statespace.sarimax import SARIMAX

from fleetwarden.forecasting.fourier import seasonal_design
from fleetwarden.forecasting.peak import PeakCalibration, calibrate_peak
from fleetwarden.forecasting.series import DAY_S, WEEK_S, FloatArray

Order = tuple[int, int, int]

HAMPEL_HALF_WINDOW = 3
"""Neighbours on each side a sample is compared with (30 minutes either side at 10-minute steps)."""
LOG_OFFSET_FRACTION = 0.01
"""Offset of the log transform as a fraction of the median positive load: small enough that the
transform is a log over the whole normal range, large enough that an idle window is not -inf."""
MAD_TO_SIGMA = 1.4826
"""Scales a median absolute deviation to a normal standard deviation."""
MAX_REUSE_LLF_DROP = 0.1
"""Nats per observation the log-likelihood of reused ARMA parameters may fall below the fit's
before they count as no longer describing the series (about a 1.2x larger innovation variance).
Measured: a day of reuse on noisy demo load fell by at most 0.07, and 7 simulated days of the
example fleet's fluid load by at most 0.04 outside the weekend; one hour into the weekend's
level drop a Friday fit whose MA root sat near -1 rang at +-9 sigma and fell by 3.2, forecasting
six times the load."""
REUSE_BIAS_WINDOW_S = 6 * 3600.0
"""The last stretch whose one-step prediction errors the innovation-bias check of a reuse sums."""
MAX_REUSE_INNOVATION_BIAS = 3.0
"""Largest |sum of the last `REUSE_BIAS_WINDOW_S` of standardised one-step prediction errors| /
sqrt(their number) a reuse may show (`innovation_bias`). Where the kept parameters describe the
series the errors are white with unit variance and this is a standard normal, so 3 is a 1-in-370
event per round. A level change is what pushes it past: the regression's daily profile stays at
the old level (with under 14 days of history no weekly term knows weekends), the ARMA errors must
carry the gap, and parameters fitted before or early in the change revert the forecast to the old
level within the hour, so every new prediction errs the same way. The likelihood check cannot see
it (those parameters fit the new minutes as well as their own), and fresh fits keep moving while
the change is young (on the demo load's first weekend day their AR root climbs from 0.87 one hour
into the drop to 0.98 by the evening). Measured on hourly rounds with fits kept for a day: on the
first weekend day of a 7-day fluid run of the built-in workload, the rounds forecasting more than
3% off fresh fits (up to 53%) showed 4.7 to 10; on ordinary weekdays it peaked at 0.7 there, at
1.5 on the demo load with 10% noise and at 2.8 over four more noise seeds (no round above 3 in
276). Re-optimising the kept order when it fires keeps that weekend day within 2.9% of fresh fits
(3.1% with grid fits instead, which took the run's forecasting CPU to 28 s instead of 17); real
ServeGen load (3 models, 8 days at 10-minute steps) re-optimises 15 times in 579 rounds
(`forecasting.warm` has the table)."""
MIN_BIAS_ERRORS = 6
"""Fewer valid one-step errors in the window than this and the innovation-bias check is skipped."""


@dataclass(frozen=True)
class ArimaSpec:
    """What to fit; `forecast.ForecastConfig` builds it (see there for the defaults' reasons)."""

    orders: tuple[Order, ...]
    daily_terms: int
    weekly_terms: int
    arma_history_s: float
    outlier_mads: float
    max_iterations: int
    band_quantiles: tuple[float, float]
    """Probabilities of the lower and upper band paths, e.g. (0.05, 0.95)."""
    peak_quantile: float
    min_calibration_blocks: int
    """Past blocks needed for the empirical peak; with fewer, the normal quantile path is used."""
    calibration_burn_in_s: float
    """Start of the ARMA window whose blocks are not used for calibration (filter settling)."""


@dataclass(frozen=True)
class ArmaParams:
    """The ARMA part of a fit: enough to filter new residuals without optimising again.

    The regression (log offset, standardisation, Fourier coefficients) is not kept: it is
    re-estimated on every call because it is cheap and absorbs slow level changes; only the
    expensive, slowly-changing part (the order chosen by AIC and its parameters) is reused.
    """

    order: Order
    params: tuple[float, ...]
    """Parameters in statsmodels' order for `SARIMAX(order, trend="n")`."""
    concentrate_scale: bool
    converged: bool
    """Whether the optimisation that produced them converged (reported again on reuse)."""
    candidates: int
    """Orders of the grid that fitted when they were chosen (reported again on reuse)."""
    step_s: float
    weekly_terms: int
    """Weekly Fourier pairs of the regression the parameters were fitted behind: a reuse with a
    different regression shape is refused (the residuals would be a different series)."""
    llf_per_obs: float
    """Log-likelihood per valid residual of the fit: a reuse that explains the new window much
    worse than this is refused (`MAX_REUSE_LLF_DROP`)."""


@dataclass(frozen=True)
class ArimaFit:
    median: FloatArray
    lower: FloatArray
    upper: FloatArray
    peak: float
    calibration: PeakCalibration
    peak_ratio: float | None
    """Multiplier applied to the median path's max; None when the normal quantile path was used."""
    order: Order
    aic: float
    converged: bool
    candidates: int
    """Orders of the grid that fitted (an order whose optimisation fails is skipped)."""
    n_points: int
    """Valid samples the Fourier regression used."""
    n_outliers: int
    daily_terms: int
    weekly_terms: int
    arma: ArmaParams
    """The order and parameters behind this forecast, for `fit_arima(..., reuse=...)`."""
    reoptimised: bool = False
    """A reuse whose parameters were refused for innovation bias and re-optimised (same order,
    started from them): `arma` holds the new parameters."""


class ArimaFitError(Exception):
    """No order of the grid produced a finite fit; the caller falls back."""


def fit_arima(
    values: FloatArray,
    timestamps_s: FloatArray,
    step_s: float,
    horizon_steps: int,
    spec: ArimaSpec,
    reuse: ArmaParams | None = None,
) -> ArimaFit:
    """Fit on `values` (NaN = missing, all finite values >= 0) and forecast `horizon_steps`.

    With `reuse`, the ARMA errors are filtered with those parameters instead of fitted;
    ArimaFitError when they were fitted on another step or regression shape, or explain the new
    residuals much worse than the ones they were fitted on (`MAX_REUSE_LLF_DROP`): the series
    changed in a way they cannot absorb, so that the caller can fit fresh. When they predicted
    the last hours persistently too high or too low (`MAX_REUSE_INNOVATION_BIAS`) their order is
    re-optimised from them instead (`ArimaFit.reoptimised`; ArimaFitError if that fails).
    """
    positive = values[values > 0]
    offset = LOG_OFFSET_FRACTION * float(np.median(positive)) if positive.size else 1.0
    if not (math.isfinite(offset) and offset > 0):
        raise ArimaFitError("load too small or too large to take its logarithm")
    with np.errstate(over="ignore"):
        w = np.log(values + offset)
    w, n_outliers = _drop_spikes(w, spec.outlier_mads)
    valid = ~np.isnan(w)
    mu, sd = float(w[valid].mean()), float(w[valid].std())
    if not sd > 0:
        raise ArimaFitError("no variation left after removing spikes")
    z = (w - mu) / sd

    daily = _usable_terms(spec.daily_terms, DAY_S, step_s)
    weekly = _usable_terms(spec.weekly_terms, WEEK_S, step_s)
    periods = ((DAY_S, daily), (WEEK_S, weekly))
    future_s = timestamps_s[-1] + step_s * np.arange(1, horizon_steps + 1)
    design = _with_intercept(seasonal_design(timestamps_s, periods))
    future_design = _with_intercept(seasonal_design(future_s, periods))
    beta, *_ = np.linalg.lstsq(design[valid], z[valid], rcond=None)
    residual = z - design @ beta
    arma_n = max(1, round(spec.arma_history_s / step_s))
    residual = residual[-arma_n:]
    if np.count_nonzero(~np.isnan(residual)) < 10:
        raise ArimaFitError("fewer than 10 valid samples in the ARMA window")

    if reuse is None:
        best = _best_order(residual, spec)
        if best is None:
            raise ArimaFitError(f"none of the {len(spec.orders)} ARIMA orders could be fitted")
        order, result, candidates = best
        arma = _arma_params(order, result, candidates, step_s, weekly, residual)
        reoptimised = False
    else:
        result, arma, reoptimised = _reuse(residual, reuse, spec, step_s, weekly)
        order = arma.order
    profile = design @ beta
    prediction = result.get_forecast(horizon_steps)
    mean = np.asarray(prediction.predicted_mean, dtype=np.float64) + future_design @ beta
    # Rounding can leave a variance a hair below zero on near-deterministic residuals.
    se = np.sqrt(np.clip(np.asarray(prediction.var_pred_mean, dtype=np.float64), 0.0, None))
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(se))):
        raise ArimaFitError(f"ARIMA{order} produced a non-finite forecast")

    def back(path: FloatArray) -> FloatArray:
        # exp of an absurd path can overflow; the caller's sanity check turns an infinite result
        # into a fallback.
        with np.errstate(over="ignore"):
            return np.clip(np.exp(path * sd + mu) - offset, 0.0, None)

    def quantile_path(p: float) -> FloatArray:
        return back(mean + NormalDist().inv_cdf(p) * se)

    median = back(mean)
    calibration = calibrate_peak(
        result,
        profile[-arma_n:],
        values[-arma_n:],
        back,
        horizon_steps,
        burn_in=round(spec.calibration_burn_in_s / step_s),
    )
    peak_ratio: float | None = None
    if calibration.blocks >= spec.min_calibration_blocks:
        peak_ratio = calibration.ratio(spec.peak_quantile)
    if peak_ratio is not None and math.isfinite(peak_ratio):
        with np.errstate(over="ignore"):
            peak = float(median.max()) * peak_ratio
    else:
        peak_ratio = None
        peak = float(quantile_path(spec.peak_quantile).max())
    return ArimaFit(
        median=median,
        lower=quantile_path(spec.band_quantiles[0]),
        upper=quantile_path(spec.band_quantiles[1]),
        peak=peak,
        calibration=calibration,
        peak_ratio=peak_ratio,
        order=order,
        aic=float(result.aic),
        converged=arma.converged,
        candidates=arma.candidates,
        n_points=int(valid.sum()),
        n_outliers=n_outliers,
        daily_terms=daily,
        weekly_terms=weekly,
        arma=arma,
        reoptimised=reoptimised,
    )


def _reuse(
    residual: FloatArray, reuse: ArmaParams, spec: ArimaSpec, step_s: float, weekly: int
) -> tuple[Any, ArmaParams, bool]:
    """Filter `residual` with `reuse`: (results, parameters behind them, re-optimised?).

    ArimaFitError when `reuse` was fitted on another step or regression shape, does not filter,
    or explains the new window much worse than its own (`MAX_REUSE_LLF_DROP`): the caller then
    optimises the whole order grid. When only its one-step predictions of the last
    `REUSE_BIAS_WINDOW_S` are biased (`MAX_REUSE_INNOVATION_BIAS`), the order still describes the
    series and only its parameters lag a level change, so they are re-optimised for that order,
    starting from themselves (a third to a tenth of the grid's cost); ArimaFitError too when
    that optimisation fails.
    """
    if (reuse.step_s, reuse.weekly_terms) != (step_s, weekly):
        raise ArimaFitError("the reused ARIMA parameters were fitted on another regression")
    result = _filter_one(residual, reuse)
    if result is None:
        raise ArimaFitError(f"the reused ARIMA{reuse.order} parameters do not filter")
    llf_per_obs = float(result.llf) / np.count_nonzero(~np.isnan(residual))
    if llf_per_obs < reuse.llf_per_obs - MAX_REUSE_LLF_DROP:
        raise ArimaFitError(
            f"the reused ARIMA{reuse.order} parameters no longer fit "
            f"({llf_per_obs:.2f} < {reuse.llf_per_obs:.2f} nats per sample)"
        )
    bias = innovation_bias(result, max(1, round(REUSE_BIAS_WINDOW_S / step_s)))
    if abs(bias) <= MAX_REUSE_INNOVATION_BIAS:
        return result, reuse, False
    result = _fit_one(residual, reuse.order, spec.max_iterations, start_params=reuse.params)
    if result is None or not math.isfinite(float(result.aic)):
        side = "above" if bias < 0 else "below"
        raise ArimaFitError(
            f"the reused ARIMA{reuse.order} parameters predicted persistently {side} the last "
            f"hours (innovation bias {bias:+.1f}) and could not be re-optimised"
        )
    arma = _arma_params(reuse.order, result, reuse.candidates, step_s, weekly, residual)
    return result, arma, True


def _best_order(residual: FloatArray, spec: ArimaSpec) -> tuple[Order, Any, int] | None:
    """The grid's order with the lowest finite AIC, preferring converged fits.

    Comparing AIC across d = 0 and d = 1 is the usual auto-ARIMA shortcut; the backtest, not the
    AIC, is what justifies the grid.
    """
    fits: list[tuple[bool, float, Order, Any]] = []
    for order in spec.orders:
        result = _fit_one(residual, order, spec.max_iterations)
        if result is None:
            continue
        aic = float(result.aic)
        if np.isfinite(aic):
            retvals = result.mle_retvals or {}
            fits.append((bool(retvals.get("converged", True)), aic, order, result))
    if not fits:
        return None
    # Converged first, then lowest AIC; the order itself breaks exact ties deterministically.
    _, _, order, result = min(fits, key=lambda f: (not f[0], f[1], f[2]))
    return order, result, len(fits)


def _arma_params(
    order: Order,
    result: Any,
    candidates: int,
    step_s: float,
    weekly: int,
    residual: FloatArray,
) -> ArmaParams:
    """What a later call needs to reuse `result`, an optimised fit of `order` to `residual`."""
    retvals = result.mle_retvals
    return ArmaParams(
        order=order,
        params=tuple(float(v) for v in np.asarray(result.params, dtype=np.float64)),
        concentrate_scale=bool(result.model.concentrate_scale),
        converged=bool(retvals.get("converged", True)) if retvals else True,
        candidates=candidates,
        step_s=step_s,
        weekly_terms=weekly,
        llf_per_obs=float(result.llf) / np.count_nonzero(~np.isnan(residual)),
    )


def _fit_one(
    residual: FloatArray,
    order: Order,
    max_iterations: int,
    start_params: tuple[float, ...] | None = None,
) -> Any:
    """A statsmodels results object (untyped upstream), or None when the optimiser gave up.

    `start_params` (an earlier fit's, same order) replace statsmodels' own starting values."""
    p, _, q = order
    # Concentrating the scale out of the likelihood removes one parameter from the optimiser; a
    # model with no ARMA parameter at all then has nothing to optimise, so keep sigma2 for it.
    model = SARIMAX(residual, order=order, trend="n", concentrate_scale=p + q > 0)
    with warnings.catch_warnings():
        # Convergence and start-parameter warnings are reported through `converged`, not stderr.
        warnings.simplefilter("ignore")
        try:
            start = None if start_params is None else np.asarray(start_params, dtype=np.float64)
            return model.fit(start_params=start, disp=False, maxiter=max_iterations)
        except (ValueError, np.linalg.LinAlgError, IndexError, OverflowError):
            # statsmodels' optimiser raises these on degenerate residuals; the order is skipped.
            return None


def _filter_one(residual: FloatArray, arma: ArmaParams) -> Any:
    """A statsmodels results object for fixed parameters (one Kalman filter pass, no
    optimisation), or None when they give no finite likelihood on these residuals."""
    model = SARIMAX(residual, order=arma.order, trend="n", concentrate_scale=arma.concentrate_scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = model.filter(np.asarray(arma.params, dtype=np.float64))
        except (ValueError, np.linalg.LinAlgError, IndexError, OverflowError):
            return None
    return result if np.isfinite(float(result.llf)) else None


def innovation_bias(result: Any, steps: int) -> float:
    """Sum of the last `steps` standardised one-step prediction errors of a filter pass, over the
    square root of their number; 0.0 when fewer than `MIN_BIAS_ERRORS` of them are valid.

    Negative when the model predicted above what came (it over-forecasts). Each error is divided
    by the filter's own prediction standard error (scaled by the window's concentrated variance,
    so the check is independent of the load's level and unit); missing samples are skipped.
    """
    filtered = result.filter_results
    errors = np.asarray(filtered.forecasts_error, dtype=np.float64)[0, -steps:]
    variances = np.asarray(filtered.forecasts_error_cov, dtype=np.float64)[0, 0, -steps:]
    usable = np.isfinite(errors) & np.isfinite(variances) & (variances > 0)
    count = int(np.count_nonzero(usable))
    if count < MIN_BIAS_ERRORS:
        return 0.0
    return float(np.sum(errors[usable] / np.sqrt(variances[usable]))) / math.sqrt(count)


def _drop_spikes(w: FloatArray, outlier_mads: float) -> tuple[FloatArray, int]:
    """Mark isolated spikes as missing (Hampel filter); `outlier_mads <= 0` disables it."""
    if outlier_mads <= 0 or w.size < 2 * HAMPEL_HALF_WINDOW + 1:
        return w, 0
    padded = np.pad(w, HAMPEL_HALF_WINDOW, mode="edge")
    windows = sliding_window_view(padded, 2 * HAMPEL_HALF_WINDOW + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows inside long gaps
        local = np.nanmedian(windows, axis=1)
    deviation = w - local
    finite = deviation[np.isfinite(deviation)]
    if finite.size == 0:
        return w, 0
    scale = MAD_TO_SIGMA * float(np.median(np.abs(finite)))
    if not scale > 0:
        return w, 0
    spikes = np.abs(np.nan_to_num(deviation, nan=0.0)) > outlier_mads * scale
    cleaned = w.copy()
    cleaned[spikes] = np.nan
    return cleaned, int(spikes.sum())


def _usable_terms(k: int, period_s: float, step_s: float) -> int:
    """At most the harmonics the sampling can resolve (Nyquist: period / k > 2 steps)."""
    return max(0, min(k, int((period_s / step_s - 1) // 2)))


def _with_intercept(design: FloatArray) -> FloatArray:
    return np.column_stack([np.ones(design.shape[0]), design])
