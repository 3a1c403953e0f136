"""TTFT percentiles with right-censored waits: requests still waiting for a first token when the run
ends count at the wait they had so far (end - arrival).

Why: percentiles over only the requests that got a first token describe the lucky ones. Under
overload a strategy that serves fewer requests then shows the better tail (a review's 6-minute
LT-UA run: 3,041 of 8,971 IW-F requests got a first token; p95 229 s over those, at least 296 s
once the waiting ones count). A waiting request's true TTFT is at least its wait so far, so the
censored percentile is a lower bound of the true one whenever a censored value falls at or below
it; `CensoredQuantile.lower_bound` says when, and the report marks such figures with ">=".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class CensoredQuantile:
    """One quantile of observed and censored values together."""

    value: float
    lower_bound: bool
    """Whether a censored value is among those the quantile is interpolated from or below them:
    the true quantile may then be higher (never lower)."""


def censored_quantiles(
    observed: npt.NDArray[np.float64], censored: npt.NDArray[np.float64], qs: Sequence[float]
) -> list[CensoredQuantile]:
    """Quantiles `qs` (0..1, numpy's default linear interpolation) of `observed` and `censored`
    taken together. With nothing censored they equal `np.quantile(observed, qs)` exactly, so a
    run where every request got a first token reports what it reported before."""
    if any(not 0.0 <= q <= 1.0 for q in qs):
        raise ValueError(f"quantiles must be within [0, 1], got {list(qs)}")
    values = np.concatenate([observed, censored])
    if not values.size:
        raise ValueError("no values to take quantiles of")
    # Stable sort with the observed values first: a censored value tied with an observed one
    # ranks after it (its true value is at least as large).
    order = np.argsort(values, kind="stable")
    is_censored = order >= observed.size
    first_censored = int(np.argmax(is_censored)) if censored.size else values.size
    quantiles = np.quantile(values, np.asarray(qs, dtype=np.float64))
    last = values.size - 1
    return [
        CensoredQuantile(float(v), math.ceil(q * last) >= first_censored)
        for q, v in zip(qs, quantiles, strict=True)
    ]
