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
from fleetwarden.sim.trace import REQUIRED, TraceError, load_trace

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
    with pytest.raises(TraceError, match=r"bad\.csv: line 3: input_tokens"):
        load_trace(bad)
    bad.write_text("arrival_s,tenant,input_tokens\n0,a,5\n")
    with pytest.raises(TraceError, match="missing output_tokens"):
        load_trace(bad)
    bad.write_text("arrival_s,tenant,input_tokens,output_tokens,tier\n0,a,5,5,gold\n")
    with pytest.raises(TraceError, match=r"bad\.csv: line 2: "):
        load_trace(bad)
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "missing.csv")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"prefill": {"baseSeconds": 0.01, "perTokenSeconds": float("inf")}}, "perTokenSeconds"),
        ({"decode": {"baseSeconds": float("nan")}}, "decode.baseSeconds must be a finite"),
        ({"decode": {"baseSeconds": -0.1}}, "decode.baseSeconds must be a finite number >= 0"),
        ({"kvBudgetTokens": "lots"}, "kvBudgetTokens must be a whole number >= 1, got 'lots'"),
        ({"kvBudgetTokens": 1000.9}, "kvBudgetTokens must be a whole number"),
        ({"admitEveryDecodeSteps": True}, "admitEveryDecodeSteps must be a whole number"),
        ({"admitEveryDecodeStep": 10}, "unknown field(s) admitEveryDecodeStep"),
        ({"prefill": [1]}, "prefill must be a mapping"),
    ],
)
def test_profile_rejects_values_the_model_cannot_run(
    change: dict[str, object], message: str
) -> None:
    """An infinite time hung the replay, a NaN one served nothing and printed NaN in --json,
    a string was a ValueError traceback and 1000.9 was truncated."""
    with pytest.raises(ProfileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        EngineProfile.from_dict({**PROFILE_DICT, **change})


def test_profile_accepts_integral_floats() -> None:
    profile = EngineProfile.from_dict({**PROFILE_DICT, "kvBudgetTokens": 1000.0})
    assert profile.kv_budget_tokens == 1000


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"name: [unclosed\n", "cannot read: while parsing"), (b"\xff\xfe", "cannot read: 'utf-8'")],
)
def test_unreadable_profile_file_is_a_profile_error(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "p.yaml"
    path.write_bytes(content)
    with pytest.raises(ProfileError, match=f"p.yaml: {message}"):
        EngineProfile.load(path)


def _csv_trace(path: Path, header: str, *rows: str) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        ("nan,a,10,5,", "line 2: arrival_s must be a finite number >= 0, got 'nan'"),
        ("inf,a,10,5,", "line 2: arrival_s must be a finite number >= 0, got 'inf'"),
        ("0,a,10,5,nan", "line 2: deadline_s must be a finite number >= 0, got 'nan'"),
        ("0,a,10,5,-3", "line 2: deadline_s must be a finite number >= 0, got '-3'"),
        ("0,a,10.9,5,", "line 2: input_tokens must be a whole number >= 1, got '10.9'"),
        ("0,a,10,5,,extra", "line 2: more cells than the header"),
    ],
)
def test_trace_rejects_non_finite_times_and_fractional_counts(
    tmp_path: Path, cells: str, message: str
) -> None:
    """A NaN or infinite arrival made `fleetwarden replay` wait for it forever."""
    path = _csv_trace(tmp_path / "t.csv", f"{','.join(REQUIRED)},deadline_s", cells)
    with pytest.raises(TraceError, match=f"t.csv: {message}"):
        load_trace(path)


@pytest.mark.parametrize(
    ("column", "values", "message"),
    [
        ("arrival_s", [0.0, float("nan")], "t.parquet: row 2: arrival_s must be a finite number"),
        (
            "input_tokens",
            [10, 10.9],
            "t.parquet: row 2: input_tokens must be a whole number >= 1, got 10.9",
        ),
        (
            "input_tokens",
            [True, False],
            "t.parquet: row 1: input_tokens must be a whole number >= 1, got True",
        ),
        ("deadline_s", [1.0, float("nan")], "t.parquet: row 2: deadline_s must be a finite number"),
    ],
)
def test_parquet_trace_values_are_checked_not_coerced(
    tmp_path: Path, column: str, values: list[object], message: str
) -> None:
    """`int()` truncated 10.9 to 10 and read True as 1."""
    columns: dict[str, list[object]] = {
        "arrival_s": [0.0, 1.0],
        "tenant": ["a", "b"],
        "input_tokens": [10, 10],
        "output_tokens": [5, 5],
        column: values,
    }
    pq.write_table(pa.table(columns), tmp_path / "t.parquet")
    with pytest.raises(TraceError, match=message):
        load_trace(tmp_path / "t.parquet")


def test_integral_token_counts_are_accepted_as_floats(tmp_path: Path) -> None:
    columns = {"arrival_s": [0.0], "tenant": ["a"], "input_tokens": [10.0], "output_tokens": [5]}
    pq.write_table(pa.table(columns), tmp_path / "t.parquet")
    assert load_trace(tmp_path / "t.parquet")[0].input_tokens == 10
    path = _csv_trace(tmp_path / "t.csv", ",".join(REQUIRED), "0,a,1e3,5.0")
    assert (load_trace(path)[0].input_tokens, load_trace(path)[0].output_tokens) == (1000, 5)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("t.parquet", b"PAR1 not parquet", "not a readable parquet file"),
        (
            "t.csv",
            b"arrival_s,tenant,input_tokens,output_tokens\n0,\xff,1,1\n",
            "not a readable UTF-8",
        ),
        ("t.csv", b"arrival_s,tenant,input_tokens,output_tokens\n", "no requests"),
    ],
)
def test_unreadable_or_empty_trace_is_a_trace_error(
    tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(TraceError, match=f"{name}: {message}"):
        load_trace(tmp_path / name)
