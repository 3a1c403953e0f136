"""Per-request traces in the unified schema: time scaling, repetition, tenants and regions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleetwarden.api.enums import Tier
from fleetwarden.sim.fleet_spec import Fleet
from fleetwarden.sim.trace_workload import UNIFIED_DIR, TraceWorkload
from fleetwarden.sim.workload import TierMix, WorkloadError
from tests.sim.fleet_fixtures import model_yaml, pool_yaml, write_fleet


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return write_fleet(
        tmp_path / "fleet",
        pool_yaml("pool-a", "region-a"),
        pool_yaml("pool-b", "region-b"),
        model_yaml(regions=(("pool-a", 1, 2), ("pool-b", 1, 2))),
    )


def _write(path: Path, **columns: list[object]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def test_speedup_and_repeat(tmp_path: Path, fleet: Fleet) -> None:
    trace = _write(
        tmp_path / "t.parquet",
        arrival_s=[10.0, 12.0, 14.0, 16.0],
        input_tokens=[100, 200, 300, 400],
        output_tokens=[10, 20, 30, 40],
        session=["a", "b", "a", "c"],
    )
    requests = list(TraceWorkload(trace, "org/m", speedup=2.0, repeat=3).build(fleet))
    # span 6 s plus one mean gap (2 s): copies start every 8 s, all at twice the speed
    assert [r.arrival_s for r in requests] == [
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0,
    ]  # fmt: skip
    assert [r.input_tokens for r in requests[:4]] == [100, 200, 300, 400]
    assert requests[4].input_tokens == 100
    by_session = {}
    for request in requests:
        key = ("a", "b", "a", "c")[int(request.input_tokens / 100) - 1]
        assert by_session.setdefault(key, (request.tenant, request.region)) == (
            request.tenant,
            request.region,
        )
    assert all(r.tier is None for r in requests)
    cut = list(TraceWorkload(trace, "org/m", repeat=5, duration_s=20.0).build(fleet))
    assert max(r.arrival_s for r in cut) < 20.0


def test_tiers_and_tenants_by_declared_rules(tmp_path: Path, fleet: Fleet) -> None:
    n = 4000
    trace = _write(
        tmp_path / "t.parquet",
        arrival_s=[float(i) for i in range(n)],
        input_tokens=[50] * n,
        output_tokens=[5] * n,
        session=[f"s{i}" for i in range(n)],
    )
    requests = list(TraceWorkload(trace, "org/m", tenants=4, tiers=TierMix()).build(fleet))
    assert {r.tenant for r in requests} == {f"tenant-{k}" for k in range(4)}
    niw = sum(r.tier is Tier.NIW for r in requests) / n
    assert niw == pytest.approx(0.28, abs=0.03)
    west = sum(r.region == "region-a" for r in requests) / n
    assert west == pytest.approx(0.5, abs=0.03)


def test_bad_traces_are_clear_errors(tmp_path: Path, fleet: Fleet) -> None:
    with pytest.raises(WorkloadError, match="no such trace"):
        TraceWorkload(tmp_path / "missing.parquet", "org/m").build(fleet)
    no_output = _write(tmp_path / "a.parquet", arrival_s=[0.0], input_tokens=[3])
    with pytest.raises(WorkloadError, match="missing columns"):
        TraceWorkload(no_output, "org/m").build(fleet)
    zero = _write(tmp_path / "b.parquet", arrival_s=[0.0], input_tokens=[3], output_tokens=[0])
    with pytest.raises(WorkloadError, match=r"b\.parquet: row 1: output_tokens"):
        TraceWorkload(zero, "org/m").build(fleet)
    (tmp_path / "c.parquet").write_text("not parquet")
    with pytest.raises(WorkloadError, match="not a readable parquet"):
        TraceWorkload(tmp_path / "c.parquet", "org/m").build(fleet)


@pytest.mark.skipif(
    not (UNIFIED_DIR / "azure2023_conv.parquet").is_file(),
    reason="../shared/data/unified not present",
)
def test_a_public_trace_replays_as_is(fleet: Fleet) -> None:
    requests = list(TraceWorkload(UNIFIED_DIR / "azure2023_conv.parquet", "org/m").build(fleet))
    assert len(requests) == 19_366
    assert np.percentile([r.input_tokens for r in requests], 50) == 1020
    assert requests[-1].arrival_s == pytest.approx(3501.72, abs=0.01)


@pytest.mark.parametrize(
    ("column", "values", "message"),
    [
        ("arrival_s", [0.0, float("nan"), 2.0], "row 2: arrival_s must be a finite number >= 0"),
        ("arrival_s", ["0", "soon", "2"], "row 2: arrival_s must be a finite number >= 0"),
        ("input_tokens", [3, 3.5, 3], "row 2: input_tokens must be a whole number >= 1"),
        ("output_tokens", [True, True, True], "row 1: output_tokens must be a whole number"),
    ],
)
def test_bad_values_name_the_row(
    tmp_path: Path, fleet: Fleet, column: str, values: list[object], message: str
) -> None:
    """A NaN arrival sorted anywhere and silently cut the stream short; a string arrival was a
    TypeError traceback; 3.5 tokens were truncated to 3."""
    columns: dict[str, list[object]] = {
        "arrival_s": [0.0, 1.0, 2.0],
        "input_tokens": [3, 3, 3],
        "output_tokens": [4, 4, 4],
        column: values,
    }
    trace = _write(tmp_path / "t.parquet", **columns)
    with pytest.raises(WorkloadError, match=message):
        TraceWorkload(trace, "org/m").build(fleet)


@pytest.mark.parametrize("speedup", [float("nan"), float("inf"), 0.0])
def test_speedup_must_be_finite_and_positive(tmp_path: Path, fleet: Fleet, speedup: float) -> None:
    """NaN passed `speedup <= 0` and simulated no request at all."""
    trace = _write(tmp_path / "t.parquet", arrival_s=[0.0], input_tokens=[3], output_tokens=[4])
    with pytest.raises(WorkloadError, match="speedup must be a finite number > 0"):
        TraceWorkload(trace, "org/m", speedup=speedup).build(fleet)
