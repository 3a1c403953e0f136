"""The forecasts used when ARIMA cannot be: seasonal naive, then the last observed peak.

They are deliberately simple and cannot fail on any cleaned series: the operator must always get a
number to plan with, and must be told (through `Forecast.model` and `fallback_reason`) that the
number is a cruder one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fleetwarden.forecasting.series import DAY_S, FloatArray

MIN_SEASONAL_DIFFERENCES = 12
"""Fewer day-over-day differences than this give no usable spread: the band collapses to the path."""


@dataclass(frozen=True)
class SimplePath:
    """A forecast path with its band, in load units, before it becomes a `Forecast`."""

    values: FloatArray
    lower: FloatArray
    upper: FloatArray
    note: str = ""


def seasonal_naive(
    values: FloatArray, step_s: float, horizon_steps: int, band_coverage: float
) -> SimplePath | None:
    """Tomorrow looks like today: the next steps repeat the same clock time one day earlier.

    Missing samples of yesterday's window are filled with the window's largest valid sample (a
    capacity plan errs high). None when yesterday's window holds no valid sample at all.
    The band comes from the spread of day-over-day differences seen in the history.
    """
    day = round(DAY_S / step_s)
    n = values.size
    if day < 1 or n < day:
        return None
    idx = np.arange(n - day, n - day + horizon_steps)
    # When the horizon is longer than a day, wrap around to repeat the last day again.
    idx = n - day + np.mod(idx - (n - day), day)
    path = values[idx]
    if np.all(np.isnan(path)):
        return None
    path = np.where(np.isnan(path), np.nanmax(path), path)
    with np.errstate(over="ignore", invalid="ignore"):
        diffs = values[day:] - values[:-day]
    diffs = diffs[np.isfinite(diffs)]  # values near the float limit overflow; skip those pairs
    if diffs.size < MIN_SEASONAL_DIFFERENCES:
        return SimplePath(path, path.copy(), path.copy(), "too few day-over-day pairs for a band")
    tail = (1.0 - band_coverage) / 2.0
    low, high = np.quantile(diffs, [tail, 1.0 - tail])
    with np.errstate(over="ignore"):
        lower, upper = path + low, path + high
    upper = np.where(np.isfinite(upper), upper, path)
    return SimplePath(path, np.clip(lower, 0.0, None), upper)


def last_peak(values: FloatArray, step_s: float, horizon_steps: int) -> SimplePath | None:
    """A flat path at the largest sample of the last horizon-long window that holds data.

    The window ends at the last valid sample, so an outage at the end of the history does not
    turn into a forecast of zero. The band runs from the window's smallest sample to its peak.
    None when there is no valid sample at all.
    """
    valid = np.flatnonzero(~np.isnan(values))
    if valid.size == 0:
        return None
    end = int(valid[-1]) + 1
    window = values[max(0, end - horizon_steps) : end]
    window = window[~np.isnan(window)]
    peak, low = float(window.max()), float(window.min())
    note = ""
    if end < values.size:
        note = f"last valid sample is {(values.size - end) * step_s / 60:.0f} min old"
    return SimplePath(
        np.full(horizon_steps, peak),
        np.full(horizon_steps, low),
        np.full(horizon_steps, peak),
        note,
    )


def hours(seconds: float) -> str:
    """`seconds` as a short human duration for reasons and notes."""
    if not math.isfinite(seconds):
        return str(seconds)
    return f"{seconds / 3600:.1f} h"
