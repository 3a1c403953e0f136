"""`fleetwarden replay` from the command line: every policy runs, reports are complete, errors clear."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from fleetwarden.cli import main
from fleetwarden.sim.engine import EngineProfile
from fleetwarden.sim.profiles import VTC_A10G
from fleetwarden.sim.replay_report import policy_names
from fleetwarden.sim.synthetic import constant_rate_trace

EXAMPLE_PROFILE = Path(__file__).resolve().parents[2] / "examples/engines/vtc-a10g.yaml"
LOTS = EXAMPLE_PROFILE.read_bytes().replace(b"kvBudgetTokens: 10000", b"kvBudgetTokens: lots")


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "trace.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["arrival_s", "tenant", "input_tokens", "output_tokens", "app", "interaction"]
        )
        sent: dict[str, int] = {}
        for t in constant_rate_trace({"a": 1.5, "b": 3.0}, 40):
            n = sent[t.tenant] = sent.get(t.tenant, 0) + 1
            # Interactions of four calls each, per tenant: --rpm 20 cuts one in the middle.
            interaction = f"{t.tenant}-{n // 4}"
            writer.writerow([t.arrival_s, t.tenant, t.input_tokens, 64, "chat", interaction])
    return path


def test_built_in_profile_is_the_example_profile() -> None:
    assert EngineProfile.load(EXAMPLE_PROFILE) == VTC_A10G


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_replays_and_reports(
    policy: str, trace_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights = tmp_path / "weights.yaml"
    weights.write_text(yaml.safe_dump({"a": 1, "b": 2}))
    code = main(
        ["replay", "--trace", str(trace_file), "--policy", policy, "--json", "--until", "60",
         "--weights", str(weights), "--rpm", "20"]
    )  # fmt: skip
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy"] == policy
    assert report["requests"] == 180
    assert report["served"] + report["throttled"] + report["rejected"] <= report["requests"]
    assert set(report["tenants"]) == {"a", "b"}
    assert {"max", "mean", "variance"} == set(report["service_difference"])
    for key in (
        "jain_backlogged",
        "throughput_tokens_per_s",
        "wasted_tokens",
        "throttled_interactions",
    ):
        assert key in report
    if policy == "rpm":
        assert report["throttled"] > 0
        assert report["throttled_interactions"] > 0
        assert report["wasted_tokens"] > 0


def test_text_report_and_engine_file(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--trace", str(trace_file), "--engine", str(EXAMPLE_PROFILE)]) == 0
    out = capsys.readouterr().out
    assert "policy vtc on vtc-a10g" in out
    assert out.count("\n") >= 4


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--policy", "lottery"], "unknown policy 'lottery'"),
        (["--policy", "rpm"], "needs --rpm"),
        (["--policy", "wvtc"], "needs --weights"),
        (["--engine", "/nonexistent.yaml"], "No such file"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    extra: list[str], message: str, trace_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "--trace", str(trace_file), *extra]) == 2
    assert message in capsys.readouterr().err


def test_bad_trace_names_the_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,tenant,input_tokens,output_tokens\n0,a,-5,5\n")
    assert main(["replay", "--trace", str(bad)]) == 2
    assert "bad.csv: line 2: input_tokens" in capsys.readouterr().err


def _example_profile_with(old: str, new: str, path: Path) -> Path:
    text = EXAMPLE_PROFILE.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize(
    ("extra", "files", "message"),
    [
        (["--until", "nan"], {}, "--until must be a number of seconds > 0, got nan"),
        (["--until", "-1"], {}, "--until must be a number of seconds > 0"),
        (["--policy", "rpm", "--rpm", "-3"], {}, "--rpm must be >= 0, got -3"),
        (["--policy", "wvtc", "--weights", "w.yaml"], {"w.yaml": b"a: 1\nb: .inf\n"}, "'b': weight must be a finite number > 0, got inf"),
        (["--policy", "wvtc", "--weights", "w.yaml"], {"w.yaml": b"a: true\n"}, "'a': weight must be a finite number > 0, got True"),
        (["--policy", "wvtc", "--weights", "w.yaml"], {"w.yaml": b"a: [1\n"}, "--weights"),
        (["--policy", "wvtc", "--weights", "w.yaml"], {"w.yaml": b"\xff\xfe"}, "cannot read: 'utf-8'"),
        (["--engine", "e.yaml"], {"e.yaml": b"name: [unclosed\n"}, "e.yaml: cannot read"),
        (["--engine", "e.yaml"], {"e.yaml": LOTS}, "kvBudgetTokens must be a whole number >= 1, got 'lots'"),
        (["--trace", "t.parquet"], {"t.parquet": b"not parquet"}, "not a readable parquet file"),
        (["--trace", "t.csv"], {"t.csv": b"arrival_s,tenant,input_tokens,output_tokens\n0,\xff,1,1\n"}, "not a readable UTF-8"),
    ],
)  # fmt: skip
def test_bad_files_and_numbers_exit_2_in_one_line(
    extra: list[str],
    files: dict[str, bytes],
    message: str,
    trace_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """These were tracebacks (ValueError, ArrowInvalid, UnicodeDecodeError, yaml errors) or ran
    with nonsense (no request simulated under --until nan; an infinite weight)."""
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    args = [str(tmp_path / a) if a in files else a for a in extra]
    assert main(["replay", "--trace", str(trace_file), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fleetwarden replay: ")
    assert err.count("\n") == 1
    assert message in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("perTokenSeconds: 0.00015", "perTokenSeconds: .inf", "prefill.perTokenSeconds"),
        ("  baseSeconds: 0.0235", "  baseSeconds: .nan", "decode.baseSeconds"),
    ],
)
def test_non_finite_engine_times_are_refused(
    old: str,
    new: str,
    message: str,
    trace_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An infinite time hung the replay; a NaN one served nothing and printed bare NaN (invalid
    JSON) under --json."""
    engine = _example_profile_with(old, new, tmp_path / "e.yaml")
    assert main(["replay", "--trace", str(trace_file), "--engine", str(engine), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{message} must be a finite number >= 0" in captured.err


@pytest.mark.timeout(60)
def test_a_nan_arrival_is_refused_not_waited_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,tenant,input_tokens,output_tokens\nnan,a,10,5\n0.5,b,10,5\n")
    assert main(["replay", "--trace", str(bad)]) == 2
    assert "bad.csv: line 2: arrival_s must be a finite number" in capsys.readouterr().err
