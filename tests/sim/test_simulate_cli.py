"""`fleetwarden simulate` end to end: a small run writes a complete report, the same seed gives
the same bytes whatever the number of processes, and bad input fails in one line with exit 2."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleetwarden.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PLOTS = ("instances.png", "utilisation.png", "ttft_cdf.png", "tenants.png", "forecast.png")
SMALL = [
    "simulate",
    "--fleet",
    str(EXAMPLES),
    "--hours",
    "0.25",
    "--rate-scale",
    "0.02",
    "--planner",
    "last-hour-peak",
    "--quiet",
]


def _simulate(out: Path, *extra: str) -> None:
    assert main([*SMALL, "--out", str(out), *extra]) == 0


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    _simulate(out, "--strategies", "reactive,lt-ua,static", "--jobs", "1")
    return out


def test_summary_has_every_figure_per_strategy(report: Path) -> None:
    summary = json.loads((report / "summary.json").read_text())
    assert summary["fidelity"] == "request-level"
    assert summary["hours"] == 0.25
    assert summary["workload"]["kind"] == "builtin"
    assert summary["workload"]["placement"] == "synthetic"
    assert summary["workload"]["requests"] > 100
    assert "60% of" in summary["scale"]
    assert summary["order"] == ["reactive", "lt-ua", "static"]
    assert set(summary["strategies"]) == set(summary["order"])
    for name, s in summary["strategies"].items():
        assert s["gpu_hours"] >= s["instance_hours"] > 0
        assert s["cost"] > 0
        assert 0 <= s["cold_start_gpu_hours"] <= s["gpu_hours"]
        assert s["donated_instance_hours"] >= 0
        assert s["requests"] == summary["workload"]["requests"]
        assert set(s["tiers"]) == {"iw-f", "iw-n", "niw"}
        for tier in ("iw-f", "iw-n"):
            stats = s["tiers"][tier]
            assert set(stats["ttft_s"]) == set(stats["e2e_s"]) == {"p50", "p95", "p99"}
            assert stats["ttft_s"]["p50"] <= stats["ttft_s"]["p95"] <= stats["ttft_s"]["p99"]
            assert 0 <= stats["attainment"] <= 1
            assert len(stats["fluidity_hist"]) == 11
            assert sum(stats["fluidity_hist"]) <= stats["completed"]
            assert 0 <= stats["fluidity_mean"] <= 1
        assert 0 < s["utilisation"]["fleet"] <= 1
        assert s["niw"]["met_deadline"] <= s["niw"]["items"]
        assert 0 < s["jain_index"] <= 1
        assert s["throttled_tokens"] >= 0
        assert s["tenants"]["tenant-00"]["demand_tokens"] > 0
        assert (report / summary["runs"][name]).is_file()
    # static capacity pins every endpoint at maxInstances, so it costs the most
    strategies = summary["strategies"]
    assert strategies["static"]["scaling"] is False
    assert strategies["static"]["gpu_hours"] > strategies["reactive"]["gpu_hours"]
    comparison = summary["comparison"]
    assert comparison["baseline"] == "reactive"
    assert comparison["reactive"]["gpu_hours_saving_vs_baseline"] == 0.0
    assert comparison["static"]["gpu_hours_saving_vs_baseline"] < 0


def test_plots_exist_and_the_html_embeds_them(report: Path) -> None:
    page = (report / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(PLOTS)
    for name in PLOTS:
        png = (report / name).read_bytes()
        assert png.startswith(b"\x89PNG")
        assert base64.b64encode(png).decode() in page
    assert "request-level" in page
    assert "<table>" in page
    assert "lt-ua" in page
    assert "src='http" not in page  # self-contained


def test_the_same_seed_gives_the_same_bytes_with_one_or_two_processes(
    report: Path, tmp_path: Path
) -> None:
    _simulate(tmp_path / "two", "--strategies", "reactive,lt-ua,static", "--jobs", "2")
    assert (tmp_path / "two" / "summary.json").read_bytes() == (
        report / "summary.json"
    ).read_bytes()
    for name in ("reactive", "lt-ua", "static"):
        run = f"runs/{name}.json"
        assert (tmp_path / "two" / run).read_bytes() == (report / run).read_bytes()


def test_another_seed_gives_another_run(report: Path, tmp_path: Path) -> None:
    _simulate(tmp_path, "--strategies", "lt-ua", "--seed", "1", "--jobs", "1")
    other = json.loads((tmp_path / "summary.json").read_text())
    assert other["seed"] == 1
    assert (tmp_path / "runs/lt-ua.json").read_bytes() != (report / "runs/lt-ua.json").read_bytes()


def test_sizing_by_instances_is_stated(tmp_path: Path) -> None:
    _simulate(
        tmp_path, "--strategies", "lt-ua", "--peak-instances", "llama-3-70b=0.2,mistral-7b=0.05"
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "--peak-instances llama-3-70b=0.2,mistral-7b=0.05" in summary["scale"]
    peaks = summary["workload"]["parameters"]["peakRequestsPerSecond"]
    assert set(peaks) == {
        "llama-3-70b/us-east",
        "llama-3-70b/us-west",
        "llama-3-70b/eu-west",
        "mistral-7b/us-east",
        "mistral-7b/eu-west",
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fleet", "no/such/dir"], "no such file or directory"),
        (["--strategies", "reactive,bogus"], "unknown strategies"),
        (["--hours", "0"], "--hours must be > 0"),
        (["--trace", "no-such.parquet"], "no such trace file"),
        (["--trace", "t.parquet", "--trace-model", "nosuch"], "--trace-model: no ModelDeployment"),
        (["--trace", "t.parquet", "--speedup", "nan"], "--speedup must be a finite number > 0"),
        (["--trace", "t.parquet", "--repeat", "0"], "--repeat must be >= 1"),
        (["--servegen", "no/such/servegen"], "ServeGen data not found"),
        (["--peak-instances", "llama-3-70b=lots"], "--peak-instances"),
        (["--peak-instances", "gpt-9=1"], "models the fleet lacks"),
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--theta-load", "0"], "--theta-load must be in (0, 1]"),
        (["--theta-load", "1.2"], "--theta-load must be in (0, 1]"),
        (["--fleet", str(EXAMPLES / "invalid" / "md-min-above-max.yaml")], "md-min-above-max"),
    ],
)
def test_bad_input_fails_in_one_line(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = [] if "--fleet" in args else ["--fleet", str(EXAMPLES)]
    if "t.parquet" in args:  # a valid trace, so that only the argument under test is wrong
        trace = tmp_path / "t.parquet"
        columns = {"arrival_s": [0.0], "input_tokens": [3], "output_tokens": [4]}
        pq.write_table(pa.table(columns), trace)
        args = [str(trace) if a == "t.parquet" else a for a in args]
    assert (
        main(["simulate", "--hours", "0.25", "--quiet", *fleet, "--out", str(tmp_path), *args]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("fleetwarden simulate: ")
    assert err.count("\n") == 1
    assert message in err
    assert not (tmp_path / "summary.json").exists()
