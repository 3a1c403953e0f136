"""`fleetwarden operator`: run the Kubernetes operator (Kopf) with leader election."""

from __future__ import annotations

import argparse
import os
from typing import Any

from fleetwarden.scaling.config import METRICS_POLL_INTERVAL_S


def run(args: argparse.Namespace) -> int:
    """Build the settings from the flags and run the operator until it is stopped."""
    # The hourly planner fits ARIMA models in this process: statsmodels' many small matrix
    # operations run 5-10x slower when OpenBLAS threads fight over busy cores. numpy reads this
    # when it is first imported (by the operator's modules, below), so it is set here, in the
    # entry point; a value set in the container's environment wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from fleetwarden.operator.main import OperatorSettings
    from fleetwarden.operator.main import run as run_operator

    settings = OperatorSettings(
        namespaces=tuple(args.namespace),
        peering_name=args.peering,
        priority=args.priority,
        liveness_endpoint=args.liveness,
        sidecar_image=args.sidecar_image,
        resync_seconds=args.resync_seconds,
        prometheus_url=args.prometheus_url,
        metrics_interval_seconds=args.metrics_interval_seconds,
        forecast_refit_hours=args.forecast_refit_hours,
    )
    run_operator(settings)
    return 0


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def register(commands: Any) -> None:
    """Add the `operator` subcommand to the top-level parser's subparsers."""
    op = commands.add_parser("operator", help="run the Kubernetes operator")
    scope = op.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument(
        "--all-namespaces", action="store_true", help="watch every namespace (the default)"
    )
    op.add_argument(
        "--peering", default="fleetwarden", help="Kopf peering name for leader election"
    )
    op.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority; default derives a stable one from $POD_NAME so replicas never tie",
    )
    op.add_argument(
        "--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    op.add_argument(
        "--sidecar-image",
        default="ghcr.io/fleetwarden/fleetwarden:0.1.0",
        help="image of the scheduler sidecar when a ModelDeployment does not set one",
    )
    op.add_argument(
        "--resync-seconds",
        type=float,
        default=60.0,
        help="how often every ModelDeployment is reconciled even without events (drift repair)",
    )
    op.add_argument(
        "--prometheus-url",
        default=None,
        help="Prometheus with the sidecars' metrics; without it regions keep their replicas",
    )
    op.add_argument(
        "--metrics-interval-seconds",
        type=float,
        default=METRICS_POLL_INTERVAL_S,
        help="seconds between two reads of utilisation and load from Prometheus",
    )
    op.add_argument(
        "--forecast-refit-hours",
        type=_non_negative,
        default=0.0,
        help="refit each series' ARIMA parameters this often and only filter new data with "
        "them in between (about 1 s per series for a fit, 10-30 ms for a filter); 0 fits fresh "
        "every round (default)",
    )
    op.set_defaults(func=run)
