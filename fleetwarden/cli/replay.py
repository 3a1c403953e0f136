"""`fleetwarden replay`: one engine instance, one scheduling policy, one trace; prints metrics."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def run(args: argparse.Namespace) -> int:
    """Replay the trace; exit 2 with a one-line reason on bad input."""
    from fleetwarden.sim import replay_report
    from fleetwarden.sim.engine import EngineProfile, ProfileError
    from fleetwarden.sim.profiles import VTC_A10G
    from fleetwarden.sim.trace import TraceError, load_trace

    try:
        _check_numbers(args)
        trace = load_trace(args.trace)
        profile = EngineProfile.load(args.engine) if args.engine else VTC_A10G
        weights = replay_report.load_weights(args.weights) if args.weights else None
        options = replay_report.Options(weights=weights, rpm=args.rpm)
        report = replay_report.run(trace, args.policy, profile, options, until_s=args.until)
    except (TraceError, ProfileError, replay_report.ReplayUsageError, OSError) as exc:
        print(f"fleetwarden replay: {exc}", file=sys.stderr)
        return 2
    print(replay_report.dumps(report) if args.json else replay_report.to_text(report))
    return 0


def _check_numbers(args: argparse.Namespace) -> None:
    """`--until` > 0 (NaN would stop before the first event, a negative time likewise, and the
    report would say nothing ran); infinity is the default, run until every request finished.
    `--rpm` >= 0, the rate limiter's own rule (0 throttles every request)."""
    from fleetwarden.sim.replay_report import ReplayUsageError

    if not args.until > 0:
        raise ReplayUsageError(f"--until must be a number of seconds > 0, got {args.until}")
    if args.rpm is not None and args.rpm < 0:
        raise ReplayUsageError(f"--rpm must be >= 0, got {args.rpm}")


def register(commands: Any) -> None:
    """Add the `replay` subcommand to the top-level parser's subparsers."""
    rp = commands.add_parser(
        "replay", help="replay a trace through one engine instance under one scheduling policy"
    )
    rp.add_argument("--trace", type=Path, required=True, help="CSV or parquet trace")
    rp.add_argument("--policy", default="vtc", help="fcfs, lcf, vtc, vtc-oracle, vtc-predict, ...")
    rp.add_argument("--weights", type=Path, help="YAML/JSON tenant weights for wvtc")
    rp.add_argument("--rpm", type=int, help="requests per minute per tenant for the rpm policy")
    rp.add_argument("--engine", type=Path, help="engine profile YAML (default: vtc-a10g)")
    rp.add_argument(
        "--until",
        type=float,
        default=float("inf"),
        help="stop at this simulated time (default: run until every request finished)",
    )
    rp.add_argument("--json", action="store_true", help="print one JSON object")
    rp.set_defaults(func=run)
