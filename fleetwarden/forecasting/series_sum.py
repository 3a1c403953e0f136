"""Combining load series for the hourly round: a region's total from its pools' series, and the
mean NIW load of the last hour (SageServe's beta buffer is a fraction of it). Pure."""

from __future__ import annotations

import math

import numpy as np

from fleetwarden.forecasting.series import Series

NIW_WINDOW_S = 3600.0
"""SageServe's beta buffer is a fraction of the past hour's NIW load."""


def sum_series(series: list[Series]) -> Series | None:
    """Sum series sample by sample on the first one's step; a slot is NaN only when every series
    is missing there (a pool that is down for a scrape does not zero its region)."""
    if not series:
        return None
    step = series[0].step_s
    if all(s.step_s == step and s.start_s == series[0].start_s for s in series):
        stacked = np.full((len(series), max(len(s.values) for s in series)), np.nan)
        for row, s in enumerate(series):
            stacked[row, : len(s.values)] = s.as_array()
        return Series(series[0].start_s, step, _nan_sum(stacked))
    start = min(s.start_s for s in series)
    end = max(s.end_s for s in series)
    n = max(1, math.ceil((end - start) / step - 1e-9))
    stacked = np.full((len(series), n), np.nan)
    for row, s in enumerate(series):
        slots = np.floor((s.timestamps() - start) / step + 1e-9).astype(np.int64)
        stacked[row, np.clip(slots, 0, n - 1)] = s.as_array()
    return Series(start, step, _nan_sum(stacked))


def _nan_sum(stacked: np.ndarray) -> tuple[float, ...]:
    # Negative or infinite samples stay as they are: forecasting's cleaning reports them.
    valid = ~np.isnan(stacked)
    total = np.where(valid, stacked, 0.0).sum(axis=0)
    return tuple(np.where(valid.any(axis=0), total, np.nan).tolist())


def last_hour_mean(series: Series | None, now_s: float, window_s: float = NIW_WINDOW_S) -> float:
    """Mean of the valid, non-negative samples in the last `window_s` before `now_s` (0 if none)."""
    if series is None:
        return 0.0
    upto = series.until(now_s)
    values = upto.tail(window_s).as_array()
    values = values[np.isfinite(values) & (values >= 0)]
    return float(values.mean()) if values.size else 0.0
