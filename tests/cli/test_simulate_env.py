"""`fleetwarden simulate` pins OpenBLAS to one thread before numpy loads, as the operator does:
its forecast planner fits ARIMA in every worker process, and OpenBLAS threads fighting over the
same cores make those fits several times slower. Bad input (`--hours inf`) ends the run right
after the variable is set, with exit 2 (`tests.support.numpy_probe`)."""

from __future__ import annotations

from tests.support.numpy_probe import numpy_probe


def test_simulate_sets_one_openblas_thread_before_numpy() -> None:
    seen = numpy_probe(["simulate", "--builtin", "--hours", "inf"])
    assert seen["code"] == 2
    assert seen["after"] == "1"
    assert seen.get("numpy", "1") == "1"  # numpy, if imported at all, saw it set
