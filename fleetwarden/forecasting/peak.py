"""Calibrating the planned peak on the model's own past hour-ahead errors.

The forecast path is a median per step, but capacity must cover the hour's *peak*: the largest of
several noisy samples, bursts included. The max of the median path is below the realised peak in
about three hours out of four, and the model's normal-theory quantiles do not fix that uniformly:
on a bursty series (ServeGen m-large) the fitted variance is wide and a given quantile overshoots,
on a smooth one (m-mid) it undershoots.

So the peak is calibrated empirically, per series, at every fit: the fitted state-space model
"hindcasts" each past horizon-long block of the ARMA window from the filtered state just before it
(exactly what it would have forecast then, with today's parameters), and the log ratios of realised
block peak to hindcast median peak form an error distribution. The planned peak is the median
path's max times the `peak_quantile` of that distribution. Realised peaks are taken from the data
before spike removal, so bursts are in the calibration even though they are out of the fit.

Cheap: one matrix product per step of the horizon for all blocks at once, no refit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetwarden.forecasting.series import FloatArray


@dataclass(frozen=True)
class PeakCalibration:
    log_ratios: FloatArray
    """log(realised peak / hindcast median peak) per past block, oldest first."""

    @property
    def blocks(self) -> int:
        return int(self.log_ratios.size)

    def ratio(self, quantile: float) -> float:
        """Multiplier for the median path's max that the realised peak exceeded `1 - quantile` of
        the time in the past blocks."""
        if self.log_ratios.size == 0:
            return math.nan
        return math.exp(float(np.quantile(self.log_ratios, quantile)))


def calibrate_peak(
    result: Any,
    profile: FloatArray,
    observed: FloatArray,
    back: Any,
    horizon: int,
    burn_in: int,
) -> PeakCalibration:
    """Hindcast every past block of `horizon` steps that ends on the block grid of the window's end.

    `result` is the statsmodels results object of the ARMA fit on the window; `profile` the
    Fourier part of the standardised log load over the window; `observed` the cleaned load (spikes
    kept) over the window; `back` maps standardised log values to load units. Blocks whose origin
    lies in the first `burn_in` steps (the filter is still settling) are skipped.
    """
    filtered = result.filter_results
    states = np.asarray(filtered.filtered_state, dtype=np.float64)
    transition = np.asarray(filtered.transition, dtype=np.float64)[:, :, 0]
    design = np.asarray(filtered.design, dtype=np.float64)[:, :, 0]
    n = observed.size
    origins = np.arange(n - horizon, max(burn_in, 1) - 1, -horizon)[::-1]
    if origins.size == 0:
        return PeakCalibration(np.empty(0))

    state = states[:, origins - 1]
    hindcast = np.empty((horizon, origins.size))
    for j in range(horizon):
        state = transition @ state
        hindcast[j] = (design @ state)[0]
    rows = origins[None, :] + np.arange(horizon)[:, None]
    median_peak = back(hindcast + profile[rows]).max(axis=0)
    realised = observed[rows]
    has_data = ~np.all(np.isnan(realised), axis=0)
    realised_peak = np.full(origins.size, np.nan)
    realised_peak[has_data] = np.nanmax(realised[:, has_data], axis=0)
    usable = (
        has_data
        & np.isfinite(median_peak)
        & (median_peak > 0)
        & np.isfinite(realised_peak)
        & (realised_peak > 0)
    )
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        log_ratios = np.log(realised_peak[usable] / median_peak[usable])
    # Denormal or near-overflow loads can still make a ratio 0 or inf; such blocks say nothing.
    return PeakCalibration(log_ratios[np.isfinite(log_ratios)])
