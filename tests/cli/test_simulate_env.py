"""`fleetwarden simulate` pins OpenBLAS to one thread before numpy loads, as the operator does:
its forecast planner fits ARIMA in every worker process, and OpenBLAS threads fighting over the
same cores make those fits several times slower. A fresh interpreter records the variable when
numpy's import starts; bad input (`--hours inf`) ends the run right after, with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_PROBE = r"""
import json, os, sys

seen = {}


class NumpySpy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and "numpy" not in seen:
            seen["numpy"] = os.environ.get("OPENBLAS_NUM_THREADS")
        return None


sys.meta_path.insert(0, NumpySpy())
from fleetwarden.cli import main

code = main(["simulate", "--builtin", "--hours", "inf"])
print(json.dumps({"code": code, "after": os.environ.get("OPENBLAS_NUM_THREADS"), **seen}))
"""


def test_simulate_sets_one_openblas_thread_before_numpy() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["code"] == 2
    assert seen["after"] == "1"
    assert seen.get("numpy", "1") == "1"  # numpy, if imported at all, saw it set
