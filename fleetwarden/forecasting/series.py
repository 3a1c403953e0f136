"""Load series on a fixed time grid, and the cleaning every forecaster applies before fitting.

A `Series` is what Prometheus gives the operator (`rate(...)[step]` over the last days) and what the
ServeGen loader builds: equally spaced values of tokens/s (or requests/s) starting at `start_s`.
Missing samples are NaN on the grid rather than absent, so that time never shifts under a gap.

Cleaning never raises: it turns every value a forecaster cannot trust (NaN, +-inf, negative rates)
into "missing" and says how many of each it found, so the forecast can report what it used.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

DAY_S = 86_400.0
WEEK_S = 7 * DAY_S


@dataclass(frozen=True)
class Series:
    """Equally spaced samples: `values[i]` is the load during `[start_s + i*step_s, +step_s)`.

    Values are a tuple so that the object is immutable and hashable like every other input of the
    pure cores; NaN marks a missing sample. A non-positive or non-finite step, or a non-finite start,
    is a programming error (the grid itself is undefined) and raises ValueError; bad *values* never
    raise anywhere in forecasting.
    """

    start_s: float
    step_s: float
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if not (math.isfinite(self.step_s) and self.step_s > 0):
            raise ValueError(f"step_s must be a positive number, got {self.step_s!r}")
        if not math.isfinite(self.start_s):
            raise ValueError(f"start_s must be finite, got {self.start_s!r}")

    @classmethod
    def of(cls, values: Iterable[float], *, start_s: float = 0.0, step_s: float = 300.0) -> Series:
        """A series from plain numbers (anything `float()` accepts; the rest is cleaned later)."""
        return cls(start_s=float(start_s), step_s=float(step_s), values=tuple(map(float, values)))

    @classmethod
    def from_points(
        cls, timestamps_s: Sequence[float], values: Sequence[float], *, step_s: float = 300.0
    ) -> Series:
        """Snap `(timestamp, value)` points onto a grid of `step_s` starting at the first timestamp.

        Points in the same slot are averaged (two scrapes of one window), empty slots become NaN
        (a gap, not idleness), and points with a non-finite timestamp are dropped: they cannot be
        placed in time. No points at all give an empty series at start 0.
        """
        if len(timestamps_s) != len(values):
            raise ValueError("timestamps_s and values must have the same length")
        t = np.asarray(timestamps_s, dtype=np.float64)
        v = np.asarray(values, dtype=np.float64)
        keep = np.isfinite(t)
        t, v = t[keep], v[keep]
        if t.size == 0:
            return cls(start_s=0.0, step_s=float(step_s), values=())
        start = float(t.min())
        slots = np.floor((t - start) / step_s + 1e-9).astype(np.int64)
        n = int(slots.max()) + 1
        sums = np.zeros(n)
        counts = np.zeros(n)
        # NaN values still occupy their slot (the scrape happened, the value is missing) but do not
        # poison a valid neighbour in the same slot.
        finite = ~np.isnan(v)
        np.add.at(sums, slots[finite], v[finite])
        np.add.at(counts, slots[finite], 1.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            grid = np.where(counts > 0, sums / np.maximum(counts, 1.0), np.nan)
        return cls(start_s=start, step_s=float(step_s), values=tuple(grid.tolist()))

    @property
    def end_s(self) -> float:
        """The time just after the last sample: where a forecast of this series starts."""
        return self.start_s + len(self.values) * self.step_s

    @property
    def duration_s(self) -> float:
        return len(self.values) * self.step_s

    def as_array(self) -> FloatArray:
        return np.asarray(self.values, dtype=np.float64)

    def timestamps(self) -> FloatArray:
        """Start time of every sample."""
        return self.start_s + self.step_s * np.arange(len(self.values), dtype=np.float64)

    def tail(self, duration_s: float) -> Series:
        """The last `duration_s` of the series (all of it when shorter)."""
        n = max(0, min(len(self.values), round(duration_s / self.step_s)))
        if n == len(self.values):
            return self
        return Series(
            self.end_s - n * self.step_s, self.step_s, self.values[len(self.values) - n :]
        )

    def until(self, end_s: float) -> Series:
        """The samples that start before `end_s`: the history a forecast at `end_s` may use."""
        n = max(0, min(len(self.values), math.floor((end_s - self.start_s) / self.step_s)))
        return Series(self.start_s, self.step_s, self.values[:n])

    def padded_to(self, end_s: float, *, keep_s: float = math.inf) -> Series:
        """The series on its own grid up to `end_s`: the samples that start before `end_s` (as
        `until`), then a missing sample (NaN) for every further whole step that starts before
        `end_s`. A forecast of the result starts at `end_s` (within one step), however long
        before it the source stopped reporting; `until` alone would start it at the last sample.

        Only the last `keep_s` of the result are kept, which bounds the padding of a series that
        stopped long ago. An empty series has no grid to extend and stays empty.
        """
        if math.isnan(keep_s):
            raise ValueError("keep_s must be a number, got nan")
        cut = self.until(end_s)
        if not cut.values:
            return cut
        n = max(len(cut.values), math.floor((end_s - self.start_s) / self.step_s))
        first = 0 if keep_s == math.inf else max(0, n - max(0, round(keep_s / self.step_s)))
        padding = (math.nan,) * (n - max(first, len(cut.values)))
        return Series(self.start_s + first * self.step_s, self.step_s, cut.values[first:] + padding)

    def trailing_missing(self) -> int:
        """Samples after the last valid one (NaN, infinite and negative are missing, as `clean`
        has it): how long, in steps, the series has been silent at its end. Its length when it
        holds no valid sample."""
        values = self.as_array()
        valid = np.flatnonzero(np.isfinite(values) & (values >= 0))
        return len(self.values) - (int(valid[-1]) + 1 if valid.size else 0)


@dataclass(frozen=True)
class CleanSeries:
    """Values with every untrustworthy sample turned into NaN, and a count of what was found."""

    values: FloatArray
    """Finite, non-negative values; NaN where the sample is missing."""
    n_missing: int
    """NaN in the input: scrape gaps, upstream collection gaps."""
    n_infinite: int
    n_negative: int

    @property
    def n_valid(self) -> int:
        return int(np.count_nonzero(~np.isnan(self.values)))

    def notes(self) -> tuple[str, ...]:
        """One human line per kind of problem, for `Forecast.notes`."""
        found = []
        if self.n_missing:
            found.append(f"{self.n_missing} missing (NaN) samples treated as gaps")
        if self.n_infinite:
            found.append(f"{self.n_infinite} infinite samples treated as gaps")
        if self.n_negative:
            found.append(
                f"{self.n_negative} negative samples treated as gaps (a rate cannot be < 0)"
            )
        return tuple(found)


def clean(values: FloatArray) -> CleanSeries:
    """Mark NaN, infinite and negative samples as missing.

    Negative values are not clipped to zero: a negative rate is a broken measurement (a counter
    subtraction gone wrong), and a zero would teach the model an idle period that never happened.
    Real zeros stay zeros.
    """
    v = np.array(values, dtype=np.float64, copy=True)
    nan = np.isnan(v)
    inf = np.isinf(v)
    neg = ~nan & ~inf & (v < 0)
    v[inf | neg] = np.nan
    return CleanSeries(
        values=v,
        n_missing=int(nan.sum()),
        n_infinite=int(inf.sum()),
        n_negative=int(neg.sum()),
    )


def window_max(values: FloatArray, start: int, stop: int) -> float:
    """Largest valid sample in `values[start:stop]`, NaN when the window holds none."""
    start, stop = max(0, start), min(values.size, stop)
    if stop <= start:
        return math.nan
    window = values[start:stop]
    window = window[~np.isnan(window)]
    return float(window.max()) if window.size else math.nan
