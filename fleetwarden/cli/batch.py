"""`fleetwarden batch`: the OpenAI-compatible Batch API and NIW dispatcher."""

from __future__ import annotations

import argparse
from typing import Any


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM; exit 2 on a bad config."""
    from fleetwarden.batch.__main__ import run as run_batch

    return run_batch(args)


def register(commands: Any) -> None:
    """Add the `batch` subcommand to the top-level parser's subparsers."""
    from fleetwarden.batch.__main__ import build_parser

    bp = commands.add_parser(
        "batch", help="run the batch service: OpenAI Batch API, durable NIW queue, dispatcher"
    )
    build_parser(bp)
    bp.set_defaults(func=run)
