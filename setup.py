"""Compiles the request-level simulator's hot modules with mypyc (metadata is in pyproject.toml).

Compiled (C extensions next to the .py files): regular builds, i.e. wheels and non-editable
installs (`pip install .`, `uv build`). Pure Python, with a notice on stderr:

- editable installs (`make setup`, `pip install -e .`): the tree you edit is the tree that runs,
  and an extension module built from an older version of a file would shadow your edits
  (docs/performance.md: "Compiled build"); `make test-compiled` and `make bench-compiled` build a
  throwaway compiled copy of the working tree instead;
- FLEETWARDEN_PURE_PYTHON=1 (or any value but 0 or empty);
- no working C compiler or no Python headers: the build falls back to pure Python rather than
  fail.

The compiled and pure builds give identical results; only their speed differs.

The sidecar's streamed-response relay (`fleetwarden/sidecar/_fastrelay*.c`, plain C, Linux) is a
different case: it is built by every install that can compile it, editable ones included, so
`make test` runs it (tests/sidecar run both relays). Its source is C, so an edit cannot be
shadowed silently: importing fleetwarden in a checkout refuses an extension older than one of its
sources (`fleetwarden/compiled.py`), and `uv pip install -e .` rebuilds it when one changes
(`[tool.uv] cache-keys`). Where it is not built, the sidecar relays in Python (`--relay auto`).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# What mypyc compiles: the request-level simulator's event loop and what it calls per request,
# nothing else. The sidecar, the operator and the batch service import none of these modules, so
# what runs in a serving pod is the same Python whichever build is installed; the fairness
# policies the simulator calls stay interpreted too (compiling fairness/limits, ordering,
# drr_queue and prediction as well measured within noise of this set). Left out on purpose
# (docs/performance.md, "Compiled build"):
# - fairness/vtc.py, wsc.py, drr.py: their heaps tell a live entry from a stale one by tuple
#   identity (`entry is state.entry`); mypyc keeps fixed-length tuples unboxed and boxes them
#   afresh where they are used, so identity never holds and the policies lose their live entries;
# - sim/planning.py: tests subclass its planners, and it runs once per simulated hour.
# Interpreted classes cannot inherit from compiled ones (a TypeError at import): a module whose
# classes are subclassed elsewhere is compiled with its subclasses (engine.py with fleet_engine.py
# and job.py) or not at all. mypyc also needs an attribute to keep one type in every class (no
# narrowing in a subclass). `make test` runs tests/sim on this set.
COMPILED_MODULES = [
    "fleetwarden/sim/cluster.py",
    "fleetwarden/sim/engine.py",
    "fleetwarden/sim/fleet_engine.py",
    "fleetwarden/sim/instance.py",
    "fleetwarden/sim/job.py",
    "fleetwarden/sim/results.py",
    "fleetwarden/sim/routing.py",
    "fleetwarden/sim/throttle.py",
]

# Commands that build extension modules; metadata-only ones (egg_info, dist_info, sdist) and
# editable builds never need mypyc to run.
BUILD_COMMANDS = {"bdist_wheel", "build", "build_ext", "install"}
EDITABLE_COMMANDS = {"editable_wheel", "develop"}


def _note(message: str) -> None:
    print(f"fleetwarden setup: {message}", file=sys.stderr)


def _why_pure() -> str | None:
    """Why this build stays pure Python, or None to compile."""
    if os.environ.get("FLEETWARDEN_PURE_PYTHON", "") not in ("", "0"):
        return "FLEETWARDEN_PURE_PYTHON is set"
    commands = set(sys.argv[1:])
    if commands & EDITABLE_COMMANDS:
        return "editable install (the tree you edit stays pure Python: `make test-compiled`)"
    if not commands & BUILD_COMMANDS:
        return "no build command"
    return _cannot_compile()


def _cannot_compile() -> str | None:
    """Why this machine cannot build a C extension, or None if it can."""
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler} not found)"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "no Python headers (Python.h; on Debian: apt-get install python3-dev)"
    return None


class OptionalBuildExt(build_ext):
    """build_ext that falls back to pure Python if compiling fails, leaving no partial build."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # noqa: BLE001 (any compiler failure means: stay pure Python)
            for output in self.get_outputs():
                Path(output).unlink(missing_ok=True)
            _note(f"compiling failed, installing pure Python instead: {error}")


def _why_no_native_relay() -> str | None:
    """Why the C relay is not built, or None to build it (editable installs too)."""
    if os.environ.get("FLEETWARDEN_PURE_PYTHON", "") not in ("", "0"):
        return "FLEETWARDEN_PURE_PYTHON is set"
    if not sys.platform.startswith("linux"):
        return "not Linux (it relays with epoll)"
    if not set(sys.argv[1:]) & (BUILD_COMMANDS | EDITABLE_COMMANDS):
        return "no build command"
    return _cannot_compile()


def _native_relay() -> list[Any]:
    reason = _why_no_native_relay()
    if reason is not None:
        if set(sys.argv[1:]) & (BUILD_COMMANDS | EDITABLE_COMMANDS):
            _note(f"the sidecar will relay streams in Python: {reason}")
        return []
    return [
        Extension(
            "fleetwarden.sidecar._fastrelay",
            [
                "fleetwarden/sidecar/_fastrelay.c",
                "fleetwarden/sidecar/_fastrelay_stream.c",
                "fleetwarden/sidecar/_fastrelay_thread.c",
                "fleetwarden/sidecar/_fastrelay_wire.c",
            ],
            depends=["fleetwarden/sidecar/_fastrelay.h"],
            extra_compile_args=["-O2", "-Wall", "-pthread"],
            extra_link_args=["-pthread"],
        )
    ]


def _ext_modules() -> list[Any]:
    reason = _why_pure()
    if reason is not None:
        if set(sys.argv[1:]) & (BUILD_COMMANDS | EDITABLE_COMMANDS):
            _note(f"pure Python build: {reason}")
        return _native_relay()
    from mypyc.build import mypycify

    # The group name fixes the shared library's name: fleetwarden__mypyc.*.so next to the package.
    return [*mypycify(COMPILED_MODULES, opt_level="3", group_name="fleetwarden"), *_native_relay()]


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
