"""The engine model's memory check and timing, and trace loading with clear errors."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetwarden.fairness.gate import staggered_peak_tokens
from fleetwarden.fairness.request import Request
from fleetwarden.sim.engine import EngineModel, EngineProfile, ProfileError
from fleetwarden.sim.trace import TraceError, load_trace

PROFILE_DICT = {
    "name": "t",
    "kvBudgetTokens": 1000,
    "admitEveryDecodeSteps": 10,
    "prefillCapTokens": 512,
    "prefill": {"baseSeconds": 0.01, "perTokenSeconds": 0.001},
    "decode": {"baseSeconds": 0.02, "perRequestSeconds": 0.001, "perContextTokenSeconds": 0.0001},
}


def _brute_force_peak(entries: list[tuple[int, int]]) -> int:
    """Grow every request one token per step until each finishes; the largest total seen."""
    held = [h for h, _ in entries]
    remaining = [r for _, r in entries]
    peak = sum(held)
    while True:
        # A finished request frees its tokens before the others grow further.
        held = [h if r else 0 for h, r in zip(held, remaining, strict=True)]
        if not any(remaining):
            return peak
        for i, left in enumerate(remaining):
            if left:
                held[i] += 1
                remaining[i] -= 1
        peak = max(peak, sum(held))


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 30)), max_size=8))
def test_staggered_peak_equals_simulating_growth(entries: list[tuple[int, int]]) -> None:
    assert staggered_peak_tokens(entries) == _brute_force_peak(entries)


def test_profile_timing_and_validation(tmp_path: Path) -> None:
    profile = EngineProfile.from_dict(PROFILE_DICT)
    assert profile.prefill_seconds(100) == pytest.approx(0.11)
    assert profile.decode_seconds(4, 1000) == pytest.approx(0.02 + 0.004 + 0.1)
    with pytest.raises(ProfileError, match="missing or malformed"):
        EngineProfile.from_dict({"kvBudgetTokens": 10})
    with pytest.raises(ProfileError, match=">= 1"):
        EngineProfile.from_dict({**PROFILE_DICT, "kvBudgetTokens": 0})
    (tmp_path / "p.yaml").write_text("- not a mapping\n")
    with pytest.raises(ProfileError, match="YAML mapping"):
        EngineProfile.load(tmp_path / "p.yaml")


def test_engine_admits_only_when_idle_or_every_k_steps() -> None:
    engine = EngineModel(EngineProfile.from_dict(PROFILE_DICT))
    assert engine.may_admit()
    first = Request(0, "a", 0.0, 100, 50)
    engine.prefill([first], 0.0, [50])
    assert not engine.may_admit()
    for _ in range(10):
        engine.after_decode_step()
    assert engine.may_admit()
    # Running: 100 held, 50 to go. A 600+400 request peaks at exactly the budget when it ends
    # (the running one is gone by then); one token more does not fit.
    assert engine.fits([Request(1, "a", 0.0, 600, 400)])
    assert not engine.fits([Request(2, "a", 0.0, 601, 400)])


def test_trace_loads_csv_and_parquet_and_names_bad_rows(tmp_path: Path) -> None:
    csv_path = tmp_path / "t.csv"
    csv_path.write_text(
        "arrival_s,tenant,input_tokens,output_tokens,tier,app\n1.5,b,10,20,iw-f,chat\n0.5,a,5,6,,\n"
    )
    trace = load_trace(csv_path)
    assert [(t.tenant, t.arrival_s) for t in trace] == [("a", 0.5), ("b", 1.5)]
    assert trace[1].tier.value == "iw-f"
    assert trace[1].app == "chat"
    table = pa.table(
        {"arrival_s": [0.0], "tenant": ["x"], "input_tokens": [3], "output_tokens": [4]}
    )
    pq.write_table(table, tmp_path / "t.parquet")
    assert load_trace(tmp_path / "t.parquet")[0].input_tokens == 3

    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,tenant,input_tokens,output_tokens\n0,a,5,5\n1,b,zero,5\n")
    with pytest.raises(TraceError, match="row 3"):
        load_trace(bad)
    bad.write_text("arrival_s,tenant,input_tokens\n0,a,5\n")
    with pytest.raises(TraceError, match="missing output_tokens"):
        load_trace(bad)
    bad.write_text("arrival_s,tenant,input_tokens,output_tokens,tier\n0,a,5,5,gold\n")
    with pytest.raises(TraceError, match="row 2"):
        load_trace(bad)
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "missing.csv")
