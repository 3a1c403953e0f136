"""`python -m fleetwarden.batch --config FILE [--listen HOST:PORT]`: the batch service alone.

The same entry as `fleetwarden batch`, without the CLI's other subcommands; the crash tests
start it as a subprocess this way.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The service's flags (shared with `fleetwarden batch`)."""
    parser = parser or argparse.ArgumentParser(prog="python -m fleetwarden.batch")
    parser.add_argument("--config", type=Path, required=True, help="service config (YAML/JSON)")
    parser.add_argument(
        "--config-overlay",
        type=Path,
        action="append",
        default=[],
        help="file deep-merged over --config, e.g. auth tokens from a Secret (repeatable)",
    )
    parser.add_argument("--listen", default=None, help="host:port (default: the config's listen)")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    return parser


def run(args: argparse.Namespace) -> int:
    """Load the config and serve; exit 2 with a one-line reason on bad config."""
    from fleetwarden.batch.config import BatchServiceConfig
    from fleetwarden.batch.service import parse_listen, serve
    from fleetwarden.batch.store import StoreError

    logging.basicConfig(
        level=str(args.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = BatchServiceConfig.load(args.config, args.config_overlay)
        parse_listen(args.listen or config.listen)
    except (OSError, ValueError, ValidationError) as exc:
        print(f"fleetwarden batch: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(config, args.listen))
    except StoreError as exc:
        print(f"fleetwarden batch: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
