"""The utilisation plot averages every endpoint that has a reading, idle ones (0.0) included.

It filtered readings by truthiness, so an endpoint reading exactly 0.0 dropped out and the plot
read busier than the summary table (0.384 against 0.280 in a review's 2 h LT-UA run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetwarden.sim import report_plots


def run(rows_a: list[list[Any]], rows_b: list[list[Any]]) -> dict[str, Any]:
    return {
        "series": {
            "sampleColumns": ["t", "utilisation", "ready"],
            "samples": {"a": rows_a, "b": rows_b},
        }
    }


def plotted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, runs: dict[str, Any]) -> list[float]:
    lines: list[list[float]] = []
    monkeypatch.setattr(
        report_plots,
        "_save",
        lambda fig, path: lines.extend(
            [list(line.get_ydata()) for line in fig.axes[0].get_lines()]
        ),
    )
    report_plots.utilisation(runs, tmp_path / "u.png")
    assert len(lines) == 1
    return lines[0]


def test_an_idle_endpoint_counts_and_a_missing_reading_does_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runs = {
        "lt-ua": run(
            [[0.0, 0.0, 1], [60.0, 0.0, 1], [120.0, None, 1]],
            [[0.0, 0.8, 1], [60.0, 0.6, 3], [120.0, 0.5, 1]],
        )
    }
    assert plotted(monkeypatch, tmp_path, runs) == pytest.approx([0.4, 0.45, 0.5])
