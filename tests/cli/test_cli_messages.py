"""What the command line tells a user: each file `crds` touched with what it did to it, a bad
stub-engine profile in one line instead of a traceback, and one convention for naming a trace row
(CSV: the file's line number; parquet: the 1-based data row) in every command that reads traces."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from fleetwarden.cli import main, render_crd_files
from fleetwarden.cli.crds import GENERATED_HEADER
from fleetwarden.sim import stub_engine

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
EXAMPLE_PROFILE = EXAMPLES / "engines" / "vtc-a10g.yaml"

# -- crds ------------------------------------------------------------------------------------------


def test_crds_says_which_files_it_wrote_removed_or_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stale generated file that was deleted was reported as `wrote <file>`."""
    out = tmp_path / "crds"
    names = list(render_crd_files())
    assert main(["crds", "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote {out / n}" for n in names]

    dropped = out / "retired-kinds.yaml"  # a CRD this command generated once, since dropped
    dropped.write_text(GENERATED_HEADER + "kind: CustomResourceDefinition\n")
    users = out / "mine.yaml"  # not generated: never touched, never mentioned
    users.write_text("kind: ConfigMap\n")
    edited = out / names[0]
    edited.write_text(GENERATED_HEADER + "edited by hand\n")

    assert main(["crds", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"wrote {edited}",
        *(f"unchanged {out / n}" for n in names[1:]),
        f"removed {dropped}",
    ]
    assert not dropped.exists()
    assert users.read_text() == "kind: ConfigMap\n"


def test_crds_check_prints_nothing_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["crds", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    (tmp_path / "retired-kinds.yaml").write_text(GENERATED_HEADER)
    assert main(["crds", "--out", str(tmp_path), "--check"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert str(tmp_path / "retired-kinds.yaml") in captured.err
    assert (tmp_path / "retired-kinds.yaml").exists()


# -- the stub engine's --profile -------------------------------------------------------------------


def _profile(**change: Any) -> str:
    data = yaml.safe_load(EXAMPLE_PROFILE.read_text())
    return yaml.safe_dump({**data, **change})


BAD_PROFILES = [
    pytest.param(None, "missing.yaml: cannot read: No such file or directory", id="missing"),
    pytest.param("name: [unclosed\n", "p.yaml: cannot read: while parsing", id="invalid-yaml"),
    pytest.param("- 1\n", "p.yaml: an engine profile is a YAML mapping", id="not-a-mapping"),
    pytest.param(
        _profile(admitEveryDecodeStep=10),
        "p.yaml: engine profile: unknown field(s) admitEveryDecodeStep",
        id="unknown-field",
    ),
    pytest.param(
        _profile(kvBudgetTokens="lots"),
        "p.yaml: engine profile: kvBudgetTokens must be a whole number >= 1, got 'lots'",
        id="wrong-type",
    ),
    pytest.param(
        _profile(decode={"baseSeconds": math.nan}),
        "p.yaml: engine profile: decode.baseSeconds must be a finite number >= 0, got nan",
        id="nan",
    ),
    pytest.param(
        _profile(prefill={"baseSeconds": 0.01, "perTokenSeconds": math.inf}),
        "p.yaml: engine profile: prefill.perTokenSeconds must be a finite number >= 0, got inf",
        id="infinite",
    ),
]


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """`web.run_app` replaced by a recorder: a test never serves, even if validation fails."""
    started: list[Any] = []
    monkeypatch.setattr(stub_engine.web, "run_app", lambda app, **kw: started.append((app, kw)))
    return started


def _write_profile(tmp_path: Path, content: str | None) -> Path:
    if content is None:
        return tmp_path / "missing.yaml"
    path = tmp_path / "p.yaml"
    path.write_text(content)
    return path


@pytest.mark.parametrize(("content", "message"), BAD_PROFILES)
def test_stub_engine_bad_profile_is_one_line_and_exit_2(
    tmp_path: Path,
    content: str | None,
    message: str,
    no_server: list[Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It ended in a ProfileError traceback; now it is the line `replay --engine` prints."""
    path = _write_profile(tmp_path, content)
    assert stub_engine.main(["--port", "0", "--profile", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fleetwarden.sim.stub_engine: {path.parent}/")
    assert err.count("\n") == 1
    assert message in err
    assert no_server == []

    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,tenant,input_tokens,output_tokens\n0,a,5,5\n")
    assert main(["replay", "--trace", str(trace), "--engine", str(path)]) == 2
    replay_err = capsys.readouterr().err
    assert replay_err.removeprefix("fleetwarden replay: ") == err.removeprefix(
        "fleetwarden.sim.stub_engine: "
    ), "the stub and `replay --engine` validate a profile the same way"


@pytest.mark.parametrize("scale", ["nan", "inf", "0", "-1"])
def test_stub_engine_bad_time_scale_is_one_line_and_exit_2(
    scale: str, no_server: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """NaN passed the `<= 0` check and went on to serve with NaN sleeps."""
    assert stub_engine.main(["--port", "0", "--time-scale", scale]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--time-scale must be a finite number > 0" in err
    assert no_server == []


def test_stub_engine_good_profile_still_serves(tmp_path: Path, no_server: list[Any]) -> None:
    path = _write_profile(tmp_path, _profile(name="custom"))
    assert stub_engine.main(["--port", "0", "--profile", str(path), "--time-scale", "0.5"]) == 0
    [(app, options)] = no_server
    assert options["port"] == 0
    assert app is not None


def test_stub_engine_module_exits_2_without_a_traceback(tmp_path: Path) -> None:
    """`python -m fleetwarden.sim.stub_engine`, as the sidecar benchmark and the docs run it."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetwarden.sim.stub_engine",
            "--profile",
            str(tmp_path / "x.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().endswith("x.yaml: cannot read: No such file or directory")


# -- trace rows ------------------------------------------------------------------------------------


def test_csv_trace_errors_name_the_files_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The line an editor shows: the header is line 1, and a blank line or a quoted cell spanning
    two lines still counts (counting records from 2 said `row 4` for line 6 here)."""
    trace = tmp_path / "t.csv"
    trace.write_text(
        "arrival_s,tenant,input_tokens,output_tokens\n"  # line 1
        "0,a,5,5\n"  # line 2
        "\n"  # line 3
        '1,"two\nlines",5,5\n'  # lines 4-5
        "2,b,zero,5\n"  # line 6
    )
    assert main(["replay", "--trace", str(trace)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"fleetwarden replay: {trace}: line 6: input_tokens must be a whole number >= 1, "
        "got 'zero'\n"
    )


def test_a_bad_multiline_record_is_named_by_its_first_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text('arrival_s,tenant,input_tokens,output_tokens\nnan,"two\nlines",5,5\n')
    assert main(["replay", "--trace", str(trace)]) == 2
    assert f"{trace}: line 2: arrival_s must be a finite" in capsys.readouterr().err


def test_parquet_trace_rows_are_named_alike_by_replay_and_simulate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`replay` said `row 3` (as if parquet had a header line) and `simulate` said `row 1`
    (0-based) for the same second row; both now say `row 2`."""
    trace = tmp_path / "t.parquet"
    columns = {
        "arrival_s": [0.0, math.nan, 2.0],
        "tenant": ["a", "b", "c"],
        "input_tokens": [3, 3, 3],
        "output_tokens": [4, 4, 4],
    }
    pq.write_table(pa.table(columns), trace)
    expected = f"{trace}: row 2: arrival_s must be a finite number >= 0, got nan\n"

    assert main(["replay", "--trace", str(trace)]) == 2
    assert capsys.readouterr().err == f"fleetwarden replay: {expected}"

    out = tmp_path / "report"
    simulate = ["simulate", "--fleet", str(EXAMPLES), "--hours", "0.25", "--quiet"]
    assert main([*simulate, "--out", str(out), "--trace", str(trace)]) == 2
    assert capsys.readouterr().err == f"fleetwarden simulate: {expected}"
