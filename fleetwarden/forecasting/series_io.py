"""Series as CSV files (`timestamp_s,value`), the format of `fleetwarden forecast backtest`.

Reading is strict about structure and lenient about values: a missing column or an unparseable
timestamp is an error naming the line (the file is not what the user thinks it is), while an empty,
`nan` or negative value is data the forecaster knows how to treat as a gap. A line is the one the
record starts on as an editor shows it, counted as every CSV reader here counts it
(`common.csv_lines`), so blank lines and quoted cells spanning lines do not shift it.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from fleetwarden.common.csv_lines import csv_records
from fleetwarden.forecasting.series import Series

COLUMNS = ("timestamp_s", "value")
DEFAULT_STEP_S = 300.0
MAX_GRID_POINTS = 5_000_000
"""Most samples a file's grid may have: 47 years at 5-minute steps, 58 days at 1 s, 40 MB of
floats. The grid spans first to last timestamp whatever lies between, so one stray timestamp
(milliseconds among seconds, `1e15`) or a tiny `--step` would otherwise ask for terabytes and
the process would die of memory instead of saying what is wrong with the input."""


class SeriesFileError(ValueError):
    """The file is missing, unreadable, or not a `timestamp_s,value` CSV."""


def read_series_csv(path: Path, step_s: float | None = None) -> Series:
    """The file's points on a grid of `step_s` (default: the median spacing of the timestamps).

    Inferring the step keeps a 10-minute file from becoming a 5-minute grid with every other
    sample missing when the caller does not pass `--step`.
    """
    try:
        with path.open(newline="") as handle:
            header, records = csv_records(handle)
            fields = [f.strip() for f in header or []]
            missing = [c for c in COLUMNS if c not in fields]
            if missing:
                raise SeriesFileError(
                    f"{path}: missing column(s) {', '.join(missing)} (need {','.join(COLUMNS)})"
                )
            # The last of duplicate names wins, as in csv.DictReader.
            column = {name: index for index, name in enumerate(fields)}
            at_t, at_v = column["timestamp_s"], column["value"]
            timestamps: list[float] = []
            values: list[float] = []
            for line, cells in records:
                timestamps.append(_timestamp(_cell(cells, at_t), path, line))
                values.append(_value(_cell(cells, at_v), path, line))
    except OSError as exc:
        raise SeriesFileError(f"{path}: {exc.strerror or exc}") from exc
    except (csv.Error, UnicodeDecodeError) as exc:
        raise SeriesFileError(f"{path}: not a readable CSV ({exc})") from exc
    if not timestamps:
        raise SeriesFileError(f"{path}: no data rows")
    step = step_s if step_s is not None else infer_step(timestamps)
    if not (math.isfinite(step) and step > 0):
        raise SeriesFileError(f"step must be a positive number of seconds, got {step!r}")
    span = max(timestamps) - min(timestamps)
    if span / step >= MAX_GRID_POINTS:  # an overflowing span is inf, also refused
        raise SeriesFileError(
            f"{path}: timestamps spanning {span:g} s at a {step:g} s step need more than "
            f"{MAX_GRID_POINTS:,} samples; check the timestamps' unit (seconds) and the step"
        )
    return Series.from_points(timestamps, values, step_s=step)


def write_series_csv(series: Series, path: Path) -> None:
    """Write `series` as `timestamp_s,value`; missing samples become empty cells."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(COLUMNS)
        for t, v in zip(series.timestamps().tolist(), series.values, strict=True):
            writer.writerow((f"{t:g}", "" if math.isnan(v) else repr(v)))


def infer_step(timestamps: list[float]) -> float:
    """Median spacing of the distinct timestamps; `DEFAULT_STEP_S` for a single point."""
    distinct = np.unique(np.asarray(timestamps, dtype=np.float64))
    if distinct.size < 2:
        return DEFAULT_STEP_S
    return float(np.median(np.diff(distinct)))


def _cell(cells: list[str], index: int) -> str | None:
    """The cell in column `index`; None when the record is shorter (csv.DictReader's restval)."""
    return cells[index] if index < len(cells) else None


def _timestamp(cell: str | None, path: Path, line: int) -> float:
    try:
        value = float(cell or "")
    except ValueError:
        raise SeriesFileError(f"{path}:{line}: timestamp_s {cell!r} is not a number") from None
    if not math.isfinite(value):
        raise SeriesFileError(f"{path}:{line}: timestamp_s {cell!r} is not finite")
    return value


def _value(cell: str | None, path: Path, line: int) -> float:
    if cell is None or not cell.strip():
        return math.nan
    try:
        return float(cell)
    except ValueError:
        raise SeriesFileError(f"{path}:{line}: value {cell!r} is not a number") from None
