"""A bad row of a series CSV is named by the line it starts on, as an editor shows it.

The reader used to number records from 2 (`enumerate` over a DictReader), so every line after a
blank line or a quoted cell spanning lines was named one line too early per extra line. It now
counts lines as the trace reader does (`fleetwarden.common.csv_lines`).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from fleetwarden.forecasting.series_io import SeriesFileError, read_series_csv


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("timestamp_s,value\n0,1\n\n600,lots\n", 4),  # after a blank line
        ("timestamp_s,value\n\n\n0,1\n600,lots\n", 5),  # blank lines right after the header
        ('timestamp_s,value\n0,"1\n"\n600,lots\n', 4),  # after a cell spanning two lines
        ('timestamp_s,value\n0,1\n600,"lo\nts"\n', 3),  # a bad multi-line cell: where it starts
        ("timestamp_s,value\r\n0,1\r\n\r\n600,lots\r\n", 4),  # CRLF line ends
    ],
)
def test_a_bad_value_names_the_line_it_is_on(tmp_path: Path, text: str, line: int) -> None:
    path = tmp_path / "s.csv"
    path.write_bytes(text.encode())
    with pytest.raises(SeriesFileError, match=rf"s\.csv:{line}: value '"):
        read_series_csv(path)


def test_a_bad_timestamp_after_a_blank_line_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text("timestamp_s,value\n0,1\n\n\nnoon,2\n")
    with pytest.raises(SeriesFileError, match=re.escape("s.csv:5: timestamp_s 'noon'")):
        read_series_csv(path)


def test_cells_are_read_as_before(tmp_path: Path) -> None:
    """Header names are stripped, columns found by name (the last of duplicates), a short row's
    missing value is a gap and cells beyond the header are ignored, as with csv.DictReader."""
    path = tmp_path / "s.csv"
    path.write_text(
        " value , timestamp_s ,value\n9,0,1\n9,300,2,extra\n\n9,600\n9,900,\n9,1200,5\n"
    )
    series = read_series_csv(path)
    assert (series.start_s, series.step_s) == (0.0, 300.0)
    assert series.values[:2] == (1.0, 2.0)
    assert math.isnan(series.values[2])
    assert math.isnan(series.values[3])
    assert series.values[4] == 5.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "missing column(s) timestamp_s, value"),
        ("\ntimestamp_s,value\n0,1\n", "missing column(s) timestamp_s, value"),
        ("time,value\n", "missing column(s) timestamp_s"),
        ("timestamp_s,value\n\n\n", "no data rows"),
    ],
)
def test_the_header_is_checked_before_any_row(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "s.csv"
    path.write_text(text)
    with pytest.raises(SeriesFileError, match=re.escape(message)):
        read_series_csv(path)
