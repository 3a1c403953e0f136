"""Per-request traces in the unified schema (`../shared/data/unified/*.parquet`): arrival_s,
input_tokens, output_tokens, tenant, session, model (and source).

The public traces are one hour (Azure 2023, Mooncake) to seven days (RAGPulse) long, come from
one service each and name neither tenants nor models nor regions, so a run declares:

- `model`: the served model every row goes to (the public traces name none; a `model` column,
  if filled, is read but not used, since its names are not the fleet's);
- tenants: the row's tenant if present, else a stable hash of its session into `tenants`
  synthetic tenants (`tenant-<k>`), else one tenant;
- regions: a stable hash of the session (or tenant, or row number) under `RegionRule`: the
  placement is synthetic;
- `speedup` divides arrival times (2.0 replays an hour in 30 minutes at twice the rate) and
  `repeat` plays the trace again back to back (each copy starts one trace span, plus one mean gap,
  after the previous), so a one-hour trace can drive a day;
- tiers: None keeps the tenant's tier from the TenantPolicy; a `TierMix` hashes each session.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from fleetwarden.sim.fleet_spec import Fleet
from fleetwarden.sim.trace import TraceError, parquet_row, read_parquet, seconds, tokens
from fleetwarden.sim.workload import (
    RegionRule,
    SimRequest,
    TierMix,
    Workload,
    WorkloadError,
    WorkloadInfo,
)

UNIFIED_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "unified"
COLUMNS = ("arrival_s", "input_tokens", "output_tokens", "tenant", "session", "model")


@dataclass(frozen=True)
class Row:
    arrival_s: float
    input_tokens: int
    output_tokens: int
    tenant: str | None
    session: str | None
    model: str | None


def read_unified(path: Path) -> list[Row]:
    """Rows of a unified-schema parquet file, in arrival order; clear errors for bad files."""
    if not path.is_file():
        raise WorkloadError(f"{path}: no such trace file")
    try:
        table = read_parquet(path)
    except TraceError as exc:
        raise WorkloadError(str(exc)) from exc
    missing = [c for c in COLUMNS[:3] if c not in table.column_names]
    if missing:
        raise WorkloadError(f"{path}: missing columns {missing} (unified schema: {COLUMNS})")
    data = table.to_pydict()
    n = table.num_rows
    absent: list[None] = [None] * n
    rows = []
    for i, (t, inp, out, tenant, session, model) in enumerate(
        zip(
            data["arrival_s"],
            data["input_tokens"],
            data["output_tokens"],
            data.get("tenant", absent),
            data.get("session", absent),
            data.get("model", absent),
            strict=True,
        )
    ):
        try:  # the checks of `fleetwarden replay` traces: finite times, whole token counts
            row = Row(
                seconds(t, "arrival_s"),
                tokens(inp, "input_tokens"),
                tokens(out, "output_tokens"),
                None if tenant is None else str(tenant),
                None if session is None else str(session),
                None if model is None else str(model),
            )
        except TraceError as exc:
            raise WorkloadError(f"{path}: {parquet_row(i)}: {exc}") from exc
        rows.append(row)
    rows.sort(key=lambda r: r.arrival_s)
    return rows


@dataclass(frozen=True)
class TraceWorkload:
    """Parameters of a trace replay (module docstring)."""

    path: Path
    model: str
    speedup: float = 1.0
    repeat: int = 1
    tenants: int = 8
    tiers: TierMix | None = None
    region_weights: Mapping[str, float] | None = None
    duration_s: float | None = None
    """Cut the stream at this time (None: every copy in full)."""

    def build(self, fleet: Fleet) -> Workload:
        if not (math.isfinite(self.speedup) and self.speedup > 0):  # NaN fails `<= 0` too
            raise WorkloadError(f"speedup must be a finite number > 0, got {self.speedup!r}")
        if self.repeat < 1 or self.tenants < 1:
            raise WorkloadError("repeat and tenants must be >= 1")
        served = fleet.model(self.model)
        rows = read_unified(self.path)
        if not rows:
            raise WorkloadError(f"{self.path}: the trace is empty")
        weights = {r: (self.region_weights or {}).get(r, 1.0) for r in served.regions}
        rule = RegionRule(weights)
        info = WorkloadInfo(
            kind="trace",
            parameters={
                "path": str(self.path),
                "model": served.served_name,
                "speedup": self.speedup,
                "repeat": self.repeat,
                "rows": len(rows),
            },
            notes=(f"Trace {self.path.name}: {rule.describe()}.",),
        )
        return Workload(info, lambda: self._generate(rows, served.served_name, rule))

    def _generate(self, rows: list[Row], model: str, rule: RegionRule) -> Iterator[SimRequest]:
        span = rows[-1].arrival_s - rows[0].arrival_s
        gap = span / max(1, len(rows) - 1)
        period = span + gap
        start = rows[0].arrival_s
        for copy in range(self.repeat):
            for index, row in enumerate(rows):
                t = (row.arrival_s - start + copy * period) / self.speedup
                if self.duration_s is not None and t >= self.duration_s:
                    return
                key = row.session or row.tenant or f"row-{index}"
                if row.tenant is not None:
                    tenant = row.tenant
                elif row.session is not None:
                    tenant = f"tenant-{zlib.crc32(row.session.encode()) % self.tenants}"
                else:
                    tenant = "tenant-0"
                yield SimRequest(
                    arrival_s=t,
                    model=model,
                    region=rule.region(key),
                    tenant=tenant,
                    input_tokens=row.input_tokens,
                    output_tokens=row.output_tokens,
                    tier=None if self.tiers is None else self.tiers.of_key(key),
                )
