"""Request traces: the unified per-request schema, loading from CSV or parquet, and validation.

Columns: `arrival_s, tenant, input_tokens, output_tokens`, optionally `app, interaction, stage,
system_tokens, tier, deadline_s`. Rows are validated up front; a bad row is an error naming the row,
never a silently dropped request.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetwarden.api.enums import Tier

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


def _optional(row: Mapping[str, Any], key: str) -> Any:
    value = row.get(key)
    return None if value is None or value == "" else value


def parse_row(row: Mapping[str, Any], line: int) -> TraceRequest:
    """One trace row, or a TraceError naming the line and the problem."""
    missing = [k for k in REQUIRED if _optional(row, k) is None]
    if missing:
        raise TraceError(f"row {line}: missing {', '.join(missing)}")
    try:
        request = TraceRequest(
            arrival_s=float(row["arrival_s"]),
            tenant=str(row["tenant"]),
            input_tokens=int(row["input_tokens"]),
            output_tokens=int(row["output_tokens"]),
            app=_optional(row, "app"),
            interaction=_optional(row, "interaction"),
            stage=_optional(row, "stage"),
            system_tokens=int(_optional(row, "system_tokens") or 0),
            tier=Tier(_optional(row, "tier") or Tier.IW_NORMAL),
            deadline_s=(
                float(row["deadline_s"]) if _optional(row, "deadline_s") is not None else None
            ),
        )
    except (TypeError, ValueError) as exc:
        raise TraceError(f"row {line}: {exc}") from exc
    if request.arrival_s < 0 or request.input_tokens < 1 or request.output_tokens < 1:
        raise TraceError(f"row {line}: arrival_s >= 0 and token counts >= 1 are required")
    if not 0 <= request.system_tokens <= request.input_tokens:
        raise TraceError(f"row {line}: system_tokens must be within [0, input_tokens]")
    return request


def parse_rows(rows: Iterable[Mapping[str, Any]]) -> list[TraceRequest]:
    """Validated requests in arrival order (stable for equal arrival times)."""
    requests = [parse_row(row, index + 2) for index, row in enumerate(rows)]
    return sorted(requests, key=lambda r: r.arrival_s)


def load_trace(path: Path) -> list[TraceRequest]:
    """Read a CSV or parquet trace."""
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as parquet
        except ImportError as exc:  # pragma: no cover - pyarrow is a dependency
            raise TraceError("reading parquet needs pyarrow") from exc
        table = parquet.read_table(path)
        return parse_rows(table.to_pylist())
    with path.open(newline="") as handle:
        return parse_rows(csv.DictReader(handle))
