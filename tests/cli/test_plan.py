"""`fleetwarden plan` against a real Prometheus with backfilled history, and its input errors.

Real: Prometheus (Debian's binary, three days of diurnal tokens/s backfilled by promtool), the
forecaster, HiGHS, the command run as a subprocess like a user would. Nothing mocked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetwarden.cli import main
from tests.operator.plan_history import history_document
from tests.support.prometheus_server import PrometheusFactory, prometheus_factory

__all__ = ["prometheus_factory"]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def plan(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "fleetwarden.cli", "plan", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env=env,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_plan_reads_history_from_prometheus(
    prometheus_factory: PrometheusFactory, tmp_path: Path
) -> None:
    now = time.time()
    history = history_document(
        now - 30.0,
        series={("mistral-7b", "us-east"): (5_000.0, 30_000.0)},
        peak_at_s=now + 1800.0,
    )
    prometheus = prometheus_factory.start(history=history)
    current = tmp_path / "current.yaml"
    current.write_text("llm-serving/mistral-7b: {us-east-a100: 3}\n")
    done = plan(
        "--fleet",
        str(EXAMPLES),
        "--prometheus",
        prometheus.url,
        "--json",
        "--current",
        str(current),
        "--at",
        str(round(now)),
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert set(data) == {"at", "status", "gap", "cost_per_hour", "history", "binding", "endpoints"}
    assert data["status"] == "optimal"
    assert data["history"] == "prometheus"
    rows = {(r["model_deployment"], r["pool"]): r for r in data["endpoints"]}
    east = rows[("llm-serving/mistral-7b", "us-east-a100")]
    assert east["forecast_model"] == "arima"
    assert 20_000 <= east["forecast_peak_tps"] <= 45_000
    assert east["current"] == 3
    assert east["target"] >= 4
    assert east["delta"] == east["target"] - 3
    assert east["cost_per_hour"] == pytest.approx(east["target"] * 3.40)
    # No history for the other regions: they hold, and say so.
    west = rows[("llm-serving/mistral-7b", "eu-west-h100")]
    assert west["held"]
    assert west["target"] == west["current"] == 1
    assert west["forecast_model"] == "no-data"
    assert west["forecast_peak_tps"] is None

    table = plan("--fleet", str(EXAMPLES), "--prometheus", prometheus.url, "--namespace", "none")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].startswith("MODEL")
    assert "solver: optimal" in table.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--fleet", "/does/not/exist"), "no such file"),
        (("--fleet", str(EXAMPLES), "--at", "yesterday"), "--at"),
        (("--fleet", str(EXAMPLES), "--at", "nan"), "--at 'nan': must be between 1970"),
        (("--fleet", str(EXAMPLES), "--at", "inf"), "--at 'inf': must be between 1970"),
        (("--fleet", str(EXAMPLES), "--at", "1e20"), "--at '1e20': must be between 1970"),
        (("--fleet", str(EXAMPLES), "--at", "0001-01-01T00:00:00Z"), "must be between 1970"),
        (("--fleet", str(EXAMPLES), "--prometheus", "http://127.0.0.1:9"), "cannot read history"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert message in lines[0]
    assert lines[0].startswith("fleetwarden plan: ")


def test_current_file_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """In process (the happy path above runs the command as a subprocess, like a user)."""
    bad = tmp_path / "current.yaml"
    bad.write_text("llm-serving/mistral-7b: {us-east-a100: -1}\n")
    assert main(["plan", "--fleet", str(EXAMPLES), "--current", str(bad)]) == 2
    assert "replicas must be an int" in capsys.readouterr().err
    bad.write_text("nobody/none: {p: 1}\n")
    assert main(["plan", "--fleet", str(EXAMPLES), "--current", str(bad)]) == 2
    assert "unknown ModelDeployments" in capsys.readouterr().err
    bad.write_text("llm-serving/mistral-7b: {no-such-pool: 7, us-east-a100: 1}\n")
    assert main(["plan", "--fleet", str(EXAMPLES), "--current", str(bad)]) == 2
    assert (
        "pools their ModelDeployment does not run on: llm-serving/mistral-7b/no-such-pool"
        in capsys.readouterr().err
    )  # was dropped silently: the plan has no such endpoint
