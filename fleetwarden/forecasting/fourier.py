"""Fourier terms: daily and weekly seasonality as exogenous regressors for ARIMA.

A seasonal ARIMA at the data's own period (288 steps a day at 5 minutes) has a state vector
hundreds of elements long and is far too slow to refit hourly. K sine/cosine pairs per period
describe a smooth daily (or weekly) profile with 2K coefficients, which the regression part of
ARIMA estimates cheaply; the ARMA errors then model what the profile misses.

Terms are computed from absolute timestamps, so the regressors of the future are the same
functions evaluated at future times: no bookkeeping of "where in the cycle" the series started,
and two series of the same clock hours share the same phase.
"""

from __future__ import annotations

import numpy as np

from fleetwarden.forecasting.series import FloatArray


def fourier_terms(timestamps_s: FloatArray, period_s: float, k: int) -> FloatArray:
    """Columns `sin(2 pi j t / P), cos(2 pi j t / P)` for j = 1..k; shape `(len(t), 2k)`.

    The phase is reduced modulo the period first so that Unix-epoch timestamps (about 1.7e9 s)
    keep full precision.
    """
    if k <= 0:
        return np.empty((timestamps_s.size, 0))
    phase = 2.0 * np.pi * np.mod(timestamps_s, period_s) / period_s
    harmonics = np.arange(1, k + 1, dtype=np.float64)
    angles = np.outer(phase, harmonics)
    columns = np.empty((timestamps_s.size, 2 * k))
    columns[:, 0::2] = np.sin(angles)
    columns[:, 1::2] = np.cos(angles)
    return columns


def seasonal_design(
    timestamps_s: FloatArray, periods_and_orders: tuple[tuple[float, int], ...]
) -> FloatArray:
    """All Fourier columns for several periods side by side (daily, then weekly)."""
    blocks = [fourier_terms(timestamps_s, period, k) for period, k in periods_and_orders if k > 0]
    if not blocks:
        return np.empty((timestamps_s.size, 0))
    return np.hstack(blocks)
