"""`fleetwarden simulate` on out-of-range input: one line naming the flag and exit code 2, never a
traceback, a 330 GiB allocation or a silently ignored flag (docs/simulator.md). Every case goes
through the real entry point; the run itself is replaced, so an input that used to be accepted
fails fast instead of starting a long simulation."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import fleetwarden.sim.run as sim_run
from fleetwarden.cli import main
from fleetwarden.sim.fleet_spec import load_fleet
from fleetwarden.sim.workload import WorkloadError
from fleetwarden.sim.workload_builtin import (
    MAX_REQUESTS,
    MAX_REQUESTS_PER_HOUR,
    BuiltinWorkload,
    VolumeError,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


class RunStartedError(Exception):
    """Raised by the stand-in for `run_strategies`: the input was accepted."""


@pytest.fixture(autouse=True)
def no_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def started(*args: object, **kwargs: object) -> None:
        raise RunStartedError

    monkeypatch.setattr(sim_run, "run_strategies", started)


def _simulate(tmp_path: Path, args: list[str]) -> int:
    if "t.parquet" in args:  # a valid trace, so that only the argument under test is wrong
        trace = tmp_path / "t.parquet"
        columns = {"arrival_s": [0.0], "input_tokens": [3], "output_tokens": [4]}
        pq.write_table(pa.table(columns), trace)
        args = [str(trace) if a == "t.parquet" else a for a in args]
    base = ["simulate", "--fleet", str(EXAMPLES), "--quiet", "--jobs", "1"]
    hours = [] if "--hours" in args else ["--hours", "0.25"]
    return main([*base, *hours, "--out", str(tmp_path / "out"), *args])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hours", "inf"], "--hours must be a finite number > 0, got inf"),
        (["--hours", "9000"], "--hours must be at most 8784"),
        (["--seed", "-1"], "--seed must be a whole number >= 0, got -1"),
        (["--rate-scale", "nan"], "--rate-scale must be a finite number >= 0, got nan"),
        (["--rate-scale", "inf"], "--rate-scale must be a finite number >= 0, got inf"),
        (["--refit-hours", "inf"], "--refit-hours must be a finite number >= 0, got inf"),
        (["--peak-instances", "inf"], "--peak-instances: 'inf': COUNT must be a finite number"),
        (
            ["--peak-instances", "llama-3-70b=1,mistral-7b=nan"],
            "--peak-instances: 'mistral-7b=nan': COUNT must be a finite number > 0",
        ),
        # the volume, estimated before any request is drawn
        (
            ["--peak-instances", "1e9", "--hours", "0.01"],
            f"--peak-instances 1e9 gives about 4.4e+11 requests in the busiest hour, over the "
            f"built-in workload's cap of {MAX_REQUESTS_PER_HOUR:,} an hour",
        ),
        (
            ["--peak-instances", "1e4", "--rate-scale", "3"],
            "--peak-instances 1e4 and --rate-scale 3 give about",
        ),
        (["--rate-scale", "1e6"], "--rate-scale 1e+06 gives about"),
        (
            ["--hours", "1000"],
            f"--hours 1000 at --rate-scale 1 is about 1.8e+08 requests, over the built-in "
            f"workload's cap of {MAX_REQUESTS:,} a run",
        ),
        # a flag of another workload source
        (["--speedup", "0"], "--speedup applies to --trace only"),
        (["--repeat", "3"], "--repeat applies to --trace only"),
        (
            ["--speedup", "0", "--repeat", "0", "--trace-model", "nosuch"],
            "--trace-model, --speedup, --repeat apply to --trace only",
        ),
        (["--servegen", "no/such/dir", "--speedup", "nan"], "--speedup applies to --trace only"),
        (
            ["--trace", "t.parquet", "--peak-instances", "1"],
            "--peak-instances applies to the built-in workload only",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _simulate(tmp_path, args) == 2
    err = capsys.readouterr().err
    assert err.startswith("fleetwarden simulate: ")
    assert err.count("\n") == 1
    assert message in err
    assert not (tmp_path / "out" / "summary.json").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--hours", "168"],  # a week at the default sizing: about 30 million requests
        ["--hours", "1000", "--fidelity", "fluid"],  # fluid draws no request: not capped
        ["--peak-instances", "1e9", "--fidelity", "fluid"],
        ["--hours", "2000", "--peak-instances", "llama-3-70b=1.2,mistral-7b=0.1"],
        ["--speedup", "1", "--repeat", "1"],  # the defaults, as written by a script
        ["--seed", "12345678901234567890"],
        ["--trace", "t.parquet", "--speedup", "2", "--repeat", "3", "--trace-model", "mistral-7b"],
    ],
)
def test_valid_input_reaches_the_run(args: list[str], tmp_path: Path) -> None:
    with pytest.raises(RunStartedError):
        _simulate(tmp_path, args)


@pytest.mark.parametrize(
    "params",
    [
        {"duration_s": 2 * 86_400.0, "start_weekday": 5},  # a weekend: 0.7 of a weekday
        {"duration_s": 30.5 * 3600, "start_weekday": 4, "start_hour": 7.0},  # part of an hour
    ],
)
def test_the_volume_is_estimated_without_drawing_and_checked_before_the_first_request(
    params: dict[str, float],
) -> None:
    fleet = load_fleet(EXAMPLES)
    spec = BuiltinWorkload(rate_scale=0.01, **params)  # type: ignore[arg-type]
    total, hour = spec.expected_requests(spec.peak_rates(fleet))
    requests = list(spec.build(fleet))
    assert total == pytest.approx(len(requests), rel=0.02)
    by_hour: dict[int, int] = {}
    for r in requests:
        by_hour[int(r.arrival_s // 3600)] = by_hour.get(int(r.arrival_s // 3600), 0) + 1
    assert max(by_hour.values()) <= hour  # an upper bound
    huge = BuiltinWorkload(duration_s=60.0, peak_tps={"llama-3-70b": {"us-east": 1e15}})
    workload = huge.build(fleet)  # building draws nothing
    with pytest.raises(VolumeError, match="busiest hour, over the cap of 2,000,000 an hour"):
        next(iter(workload))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"rate_scale": math.nan}, "rate_scale must be a finite number >= 0"),
        ({"duration_s": math.inf}, "duration_s must be a finite number > 0"),
        ({"peak_tps": {"m": {"r": math.inf}}}, "peak_tps[m][r] must be a finite number >= 0"),
        ({"seed": -1}, "seed must be a whole number >= 0"),
        ({"tenants": 0}, "tenants must be a whole number >= 1"),
    ],
)
def test_the_workload_refuses_non_finite_parameters(
    params: dict[str, object], message: str
) -> None:
    with pytest.raises(WorkloadError) as caught:
        BuiltinWorkload(**params)  # type: ignore[arg-type]
    assert message in str(caught.value)
