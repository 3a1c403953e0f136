"""Request traces: the unified per-request schema, loading from CSV or parquet, and validation.

Columns: `arrival_s, tenant, input_tokens, output_tokens`, optionally `app, interaction, stage,
system_tokens, tier, deadline_s`. Rows are validated up front; a bad row is an error naming the row,
never a silently dropped request.

Where a row is named, every reader says it one way, the way a user finds it: in a CSV file
`line N`, the file's own 1-based line number (the header is line 1), which is what an editor
shows; in a parquet file, which has no lines, `row N`, the 1-based data row.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetwarden.api.enums import Tier
from fleetwarden.common.csv_lines import csv_rows
from fleetwarden.sim.input_values import InputValueError, finite_number, whole_number

REQUIRED = ("arrival_s", "tenant", "input_tokens", "output_tokens")


class TraceError(ValueError):
    """A trace file cannot be read or a row is invalid."""


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    tenant: str
    input_tokens: int
    output_tokens: int
    app: str | None = None
    interaction: str | None = None
    stage: str | None = None
    system_tokens: int = 0
    tier: Tier = Tier.IW_NORMAL
    deadline_s: float | None = None
    """Relative to arrival: the first token is due `deadline_s` after the request arrives."""


def _optional(row: Mapping[str | None, Any], key: str) -> Any:
    value = row.get(key)
    return None if value is None or value == "" else value


def seconds(value: object, column: str) -> float:
    """A finite time >= 0 from a trace cell, or a TraceError naming the column."""
    try:
        return finite_number(value)
    except InputValueError as exc:
        raise TraceError(f"{column} {exc}") from None


def tokens(value: object, column: str, minimum: int = 1) -> int:
    """A whole token count >= `minimum` from a trace cell, or a TraceError naming the column."""
    try:
        return whole_number(value, minimum=minimum)
    except InputValueError as exc:
        raise TraceError(f"{column} {exc}") from None


def parquet_row(index: int) -> str:
    """How the parquet row at 0-based `index` is named in messages: 1-based, `row 1` first."""
    return f"row {index + 1}"


def parse_row(row: Mapping[str | None, Any], where: str) -> TraceRequest:
    """One trace row, or a TraceError starting with `where` (`csv_line` or `parquet_row`)."""
    missing = [k for k in REQUIRED if _optional(row, k) is None]
    if missing:
        raise TraceError(f"{where}: missing {', '.join(missing)}")
    if None in row:  # the cells beyond the header are filed under None, as csv.DictReader does
        raise TraceError(f"{where}: more cells than the header has columns")
    deadline = _optional(row, "deadline_s")
    try:
        request = TraceRequest(
            arrival_s=seconds(row["arrival_s"], "arrival_s"),
            tenant=str(row["tenant"]),
            input_tokens=tokens(row["input_tokens"], "input_tokens"),
            output_tokens=tokens(row["output_tokens"], "output_tokens"),
            app=_optional(row, "app"),
            interaction=_optional(row, "interaction"),
            stage=_optional(row, "stage"),
            system_tokens=tokens(_optional(row, "system_tokens") or 0, "system_tokens", 0),
            tier=Tier(_optional(row, "tier") or Tier.IW_NORMAL),
            deadline_s=None if deadline is None else seconds(deadline, "deadline_s"),
        )
    except (TypeError, ValueError) as exc:
        raise TraceError(f"{where}: {exc}") from exc
    if request.system_tokens > request.input_tokens:
        raise TraceError(f"{where}: system_tokens must be within [0, input_tokens]")
    return request


def parse_rows(rows: Iterable[tuple[str, Mapping[str | None, Any]]]) -> list[TraceRequest]:
    """Validated requests in arrival order (stable for equal arrival times); `rows` pairs each
    row with where it is (`csv_line`, `parquet_row`) for the messages."""
    requests = [parse_row(row, where) for where, row in rows]
    return sorted(requests, key=lambda r: r.arrival_s)


def read_parquet(path: Path) -> Any:
    """The pyarrow table of a parquet file, or a TraceError saying it is not one (pyarrow raises
    ArrowInvalid, OSError and others for a file that is not parquet or is cut short)."""
    try:
        import pyarrow
        import pyarrow.parquet as parquet
    except ImportError as exc:  # pragma: no cover - pyarrow is a dependency
        raise TraceError("reading parquet needs pyarrow") from exc
    try:
        return parquet.read_table(path)
    except (pyarrow.ArrowException, OSError, ValueError) as exc:
        raise TraceError(f"{path}: not a readable parquet file: {_one_line(exc)}") from exc


def load_trace(path: Path) -> list[TraceRequest]:
    """Read a CSV or parquet trace; an empty trace is an error (there is nothing to replay)."""
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    table = read_parquet(path) if path.suffix == ".parquet" else None
    try:
        if table is not None:
            requests = parse_rows(
                (parquet_row(index), row) for index, row in enumerate(table.to_pylist())
            )
        else:
            with path.open(newline="") as handle:
                requests = parse_rows(csv_rows(handle))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(f"{path}: not a readable UTF-8 CSV file: {_one_line(exc)}") from exc
    except TraceError as exc:  # a row's problem: the line or row alone does not say which file
        raise TraceError(f"{path}: {exc}") from exc
    if not requests:
        raise TraceError(f"{path}: no requests (need a header {','.join(REQUIRED)} and rows)")
    return requests


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
