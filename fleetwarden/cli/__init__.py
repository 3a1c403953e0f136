"""The `fleetwarden` command: one entry point, a subcommand per component.

Each subcommand lives in its own module here with a `register(commands)` function; the modules
import their component lazily, so `fleetwarden crds` works without the operator's dependencies
being importable and each command starts fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from fleetwarden.cli import (
    batch,
    batch_targets,
    crds,
    forecast,
    operator,
    plan,
    replay,
    sidecar,
    simulate,
)
from fleetwarden.cli.crds import DEFAULT_CRD_DIRS, render_crd_files

__all__ = ["DEFAULT_CRD_DIRS", "build_parser", "main", "render_crd_files"]

_SUBCOMMANDS = (crds, operator, replay, sidecar, batch, batch_targets, forecast, simulate, plan)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; exposed for tests and for `--help` documentation."""
    parser = argparse.ArgumentParser(prog="fleetwarden", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for module in _SUBCOMMANDS:
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code
