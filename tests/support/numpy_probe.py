"""Run a `fleetwarden` command in a fresh interpreter and report the environment numpy saw.

numpy reads `OPENBLAS_NUM_THREADS` only when it is first imported, so a command that pins
OpenBLAS must set it before that import. A meta-path finder records the variable at the moment
numpy's import starts; `asyncio.run` may be stubbed so a long-running command (the operator)
returns at once. The child prints one JSON line: `code` (the command's exit code), `after`
(the variable when it returned), `numpy` (the variable numpy saw, absent if never imported) and
`ran` (whether the stubbed `asyncio.run` was reached).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

_PROBE = r"""
import asyncio, json, os, sys

seen = {}


class NumpySpy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and "numpy" not in seen:
            seen["numpy"] = os.environ.get("OPENBLAS_NUM_THREADS")
        return None


def fake_asyncio_run(coro):
    coro.close()
    seen["ran"] = True


sys.meta_path.insert(0, NumpySpy())
if STUB_ASYNCIO_RUN:
    asyncio.run = fake_asyncio_run
from fleetwarden.cli import main

code = main(ARGV)
print(json.dumps({"code": code, "after": os.environ.get("OPENBLAS_NUM_THREADS"), **seen}))
"""


def numpy_probe(argv: list[str], *, stub_asyncio_run: bool = False) -> dict[str, object]:
    """What `fleetwarden <argv>` did, run without `OPENBLAS_NUM_THREADS` in its environment."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    source = _PROBE.replace("STUB_ASYNCIO_RUN", repr(stub_asyncio_run)).replace("ARGV", repr(argv))
    done = subprocess.run(
        [sys.executable, "-c", source],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
