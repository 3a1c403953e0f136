"""CSV records with the line each starts on, so every reader names a bad row the same way.

A user finds a row by the line number an editor shows: the header is line 1, and a blank line or
a quoted cell spanning lines shifts every later record. Counting records from 2 (`enumerate`
over a `csv.DictReader`) is wrong after either, and the reader's `line_num` is the line a record
ends on, so the start is taken before each record is read.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import Any, TextIO


def csv_line(line: int) -> str:
    """How a CSV record is named in messages: its 1-based line in the file (header = line 1)."""
    return f"line {line}"


def csv_records(handle: TextIO) -> tuple[list[str] | None, Iterator[tuple[int, list[str]]]]:
    """The header row (None for an empty file) and the records after it, blank lines skipped as
    csv.DictReader skips them, each with the 1-based line it starts on. The header is read at
    once, so a reader can refuse a file by its columns before looking at any row."""
    reader = csv.reader(handle)
    header = next(reader, None)

    def records() -> Iterator[tuple[int, list[str]]]:
        while True:
            start = reader.line_num + 1
            cells = next(reader, None)
            if cells is None:
                return
            if cells:
                yield start, cells

    return header, records()


def csv_rows(handle: TextIO) -> Iterator[tuple[str, dict[str | None, Any]]]:
    """The records of a CSV file as csv.DictReader gives them (the first line is the header,
    blank lines after it are skipped, a missing cell reads as None, extra cells are under the key
    None), each paired with `csv_line` of the line it starts on.

    Not DictReader itself: counting its records from line 2 is off after a blank line or a
    quoted cell spanning lines, and its `line_num` is the line a record ends on."""
    header, records = csv_records(handle)
    if header is None:
        return
    for start, cells in records:
        record: dict[str | None, Any] = dict(zip(header, cells, strict=False))
        if len(cells) > len(header):
            record[None] = cells[len(header) :]
        yield csv_line(start), record
