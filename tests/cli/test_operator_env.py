"""`fleetwarden operator` pins OpenBLAS to one thread before numpy loads.

The hourly planner fits ARIMA models inside the operator process, and OpenBLAS threads fighting
over busy cores make those fits 5-10x slower. numpy reads `OPENBLAS_NUM_THREADS` only when it is
first imported, so the variable must be in the environment by then: the subprocess test watches
the first import of numpy on the real `fleetwarden operator` path (only `asyncio.run`, the call
that would start Kopf, is replaced).
"""

from __future__ import annotations

import argparse
import os
import sys
import types

import pytest

from fleetwarden.cli import build_parser
from fleetwarden.cli import operator as operator_cli
from tests.support.numpy_probe import numpy_probe


def test_operator_sets_openblas_threads_before_numpy_is_imported() -> None:
    result = numpy_probe(["operator"], stub_asyncio_run=True)
    assert result.get("ran") is True, result  # the operator path was followed to the end
    assert "numpy" in result, "the operator no longer imports numpy: revisit this test"
    assert result["numpy"] == "1", result


def test_operator_keeps_a_value_set_in_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deployment that sets the variable itself (more threads on an idle node) wins."""
    calls: list[object] = []
    fake_main = types.ModuleType("fleetwarden.operator.main")
    fake_main.OperatorSettings = lambda **kwargs: kwargs  # type: ignore[attr-defined]
    fake_main.run = calls.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fleetwarden.operator.main", fake_main)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    args: argparse.Namespace = build_parser().parse_args(["operator"])

    assert operator_cli.run(args) == 0
    assert os.environ["OPENBLAS_NUM_THREADS"] == "3"
    assert len(calls) == 1
