"""`fleetwarden plan`: the operator's hourly fleet plan as a dry run, changing nothing.

It runs the same round the operator runs (`forecasting.hourly.plan_round`) on the fleet and,
with `--prometheus`, on the history the operator would read (the same queries,
`operator.hourly_planner.read_history`). The fleet comes from the cluster by default, read with
the operator's own client and rules (`operator.fleet_reader`, GET requests only), so the dry run
sees what the operator's round sees, replicas now included; `--fleet` reads custom-resource YAML
instead (offline, reviews of a change before applying it). Bad input or an unreachable cluster
exits with code 2 and one line on stderr; invalid objects in the cluster are skipped with a
warning line each, as the operator plans around them.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from fleetwarden.forecasting.hourly import FleetSpecs, PoolUsage

USAGE_ERROR = 2


class PlanInputError(ValueError):
    """Bad command-line input: reported as one line, exit code 2."""


LATEST_S = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
"""The last time `--at` may name: the plan prints its time as a date, and Python's dates end here."""


def parse_time(text: str | None) -> float:
    """`--at`: RFC 3339 (`2025-01-31T12:00:00Z`) or seconds since the epoch; None is now.

    Within [epoch, year 9999]: NaN, infinity or 1e20 would fail deep in the round with a traceback
    (datetime cannot hold them), and a time before 1970 has no Prometheus history to read."""
    if text is None:
        return datetime.now(UTC).timestamp()
    try:
        at = float(text)
    except ValueError:
        at = _rfc3339(text)
    if not 0 <= at <= LATEST_S:  # also NaN
        raise PlanInputError(f"--at {text!r}: must be between 1970 and the end of year 9999")
    return at


def _rfc3339(text: str) -> float:
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise PlanInputError(f"--at {text!r}: not RFC 3339 nor seconds since the epoch") from exc
    if parsed.tzinfo is None:
        raise PlanInputError(f"--at {text!r}: give a time zone (e.g. a trailing Z)")
    return parsed.timestamp()


def read_current(path: Path | None) -> dict[tuple[str, str], int]:
    """`--current`: YAML or JSON `{namespace/name: {pool: replicas}}`."""
    if path is None:
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise PlanInputError(f"--current {path}: cannot read: {exc}") from exc
    if not isinstance(data, dict):
        raise PlanInputError(f"--current {path}: expected a mapping namespace/name -> pool -> n")
    out: dict[tuple[str, str], int] = {}
    for md, pools in data.items():
        if not isinstance(pools, dict):
            raise PlanInputError(f"--current {path}: {md}: expected a mapping pool -> replicas")
        for pool, n in pools.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise PlanInputError(f"--current {path}: {md}/{pool}: replicas must be an int >= 0")
            out[(str(md), str(pool))] = n
    return out


def _one_line(exc: BaseException | str) -> str:
    return " ".join(str(exc).split())


@dataclass
class FleetInput:
    """The fleet to plan, wherever it came from, and what the output says about its source.

    Mutable: `--current` is applied on top of whatever source filled it."""

    specs: FleetSpecs
    current: dict[tuple[str, str], int]
    current_source: dict[tuple[str, str], str]
    """Per endpoint: `status`, `deployment`, `--current` or `minInstances`."""
    reserved: dict[str, PoolUsage]
    warnings: tuple[str, ...] = ()


def load_input(args: argparse.Namespace) -> FleetInput:
    """`--fleet` files, or the cluster; then `--current` overrides the counts it names."""
    from fleetwarden.sim.fleet_spec import load_fleet
    from fleetwarden.sim.forecast_planner import fleet_specs

    override = read_current(args.current)
    if args.fleet:
        fleet = FleetInput(fleet_specs(load_fleet(list(args.fleet))), {}, {}, {})
    else:
        from fleetwarden.operator.fleet_reader import read_cluster_fleet

        cluster = read_cluster_fleet(args.namespace)
        snap = cluster.snapshot
        fleet = FleetInput(
            snap.specs,
            dict(snap.current),
            dict(cluster.current_source),
            dict(snap.reserved),
            cluster.warnings,
        )
    mds = fleet.specs.model_deployments
    unknown = sorted(f"{md}/{pool}" for md, pool in override if md not in mds)
    if unknown:
        raise PlanInputError(f"--current names unknown ModelDeployments: {', '.join(unknown)}")
    unused = sorted(
        f"{md}/{pool}"
        for md, pool in override
        if pool not in {placement.pool for placement in mds[md].regions}
    )
    if unused:  # the count would be dropped silently: the plan has no such endpoint
        raise PlanInputError(
            f"--current names pools their ModelDeployment does not run on: {', '.join(unused)}"
        )
    fleet.current.update(override)
    fleet.current_source.update(dict.fromkeys(override, "--current"))
    return fleet


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: see cli/forecast.py
    # The client logs each failed attempt; a dry-run command reports the outcome once instead.
    logging.getLogger("fleetwarden.metrics").setLevel(logging.ERROR)
    from fleetwarden.forecasting.hourly import FleetPlanError, RoundInput, plan_round
    from fleetwarden.metrics.client import PrometheusClient, PrometheusError
    from fleetwarden.operator.fleet_reader import ClusterReadError
    from fleetwarden.operator.hourly_planner import attach_history, read_history
    from fleetwarden.sim.fleet_spec import FleetSpecError

    from .native_output import native_stdout_to_stderr

    try:
        at = parse_time(args.at)
        fleet = load_input(args)
        for warning in fleet.warnings:
            print(f"fleetwarden plan: warning: {_one_line(warning)}", file=sys.stderr)
        specs = fleet.specs
        history = {}
        if args.prometheus:
            with PrometheusClient(args.prometheus) as client:
                history = attach_history(specs, read_history(client, specs, at))
        with native_stdout_to_stderr():  # HiGHS prints a banner to fd 1: keep it off the plan
            result = plan_round(
                RoundInput(specs, history, fleet.current, now_s=at, reserved=fleet.reserved)
            )
    except (PlanInputError, FleetSpecError, FleetPlanError) as exc:
        print(f"fleetwarden plan: {_one_line(exc)}", file=sys.stderr)
        return USAGE_ERROR
    except ClusterReadError as exc:
        print(f"fleetwarden plan: cannot read the fleet: {_one_line(exc)}", file=sys.stderr)
        return USAGE_ERROR
    except PrometheusError as exc:
        print(f"fleetwarden plan: cannot read history: {_one_line(exc)}", file=sys.stderr)
        return USAGE_ERROR
    rows = [
        {
            "model_deployment": e.model_deployment,
            "region": e.region,
            "pool": e.pool,
            "current": e.current,
            "current_source": fleet.current_source.get(
                (e.model_deployment, e.pool), "minInstances"
            ),
            "forecast_peak_tps": e.region_peak_tps,
            "forecast_model": e.forecast_model,
            "fallback_reason": e.fallback_reason,
            "held": e.held,
            "target": e.target,
            "delta": e.delta,
            "cost_per_hour": round(e.cost_per_hour, 4),
        }
        for _, e in sorted(result.endpoints.items())
        if args.namespace is None or e.model_deployment.startswith(f"{args.namespace}/")
    ]
    data: dict[str, Any] = {
        "at": datetime.fromtimestamp(round(at), UTC).isoformat().replace("+00:00", "Z"),
        "status": result.status,
        "gap": result.gap,
        "cost_per_hour": round(result.cost_per_hour, 4),
        "history": "prometheus" if args.prometheus else "none",
        "binding": list(result.binding),
        "endpoints": rows,
    }
    print(json.dumps(data, indent=2) if args.json else _table(data))
    return 0


def _peak(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:,.0f}"


def _table(data: dict[str, Any]) -> str:
    header = (
        f"{'MODEL':28} {'REGION':12} {'POOL':16} {'CURRENT':>7} {'FROM':12} {'PEAK TOK/S':>11} "
        f"{'FORECAST':15} {'TARGET':>6} {'DELTA':>6} {'COST/H':>9}"
    )
    lines = [header]
    for r in data["endpoints"]:
        model = r["forecast_model"] + (" (held)" if r["held"] else "")
        lines.append(
            f"{r['model_deployment']:28} {r['region']:12} {r['pool']:16} {r['current']:>7} "
            f"{r['current_source']:12} {_peak(r['forecast_peak_tps']):>11} {model:15} {r['target']:>6} "
            f"{r['delta']:>+6} {r['cost_per_hour']:>9.2f}"
        )
    gap = "" if data["gap"] is None else f", gap {100 * data['gap']:.2f}%"
    lines.append(
        f"solver: {data['status']}{gap}; cost of the plan {data['cost_per_hour']:.2f}/h; "
        f"planned at {data['at']}"
    )
    if data["history"] == "none":
        lines.append("no --prometheus: no history, every region holds its current replicas")
    lines.extend(f"binding: {line}" for line in data["binding"])
    return "\n".join(lines)


def register(commands: Any) -> None:
    """Add the `plan` command to the top-level parser's subparsers."""
    p = commands.add_parser(
        "plan",
        help="dry run of the hourly fleet plan: forecast, solve, print targets",
        description=(
            "Forecast tokens/s per model and region, solve the capacity plan for the whole fleet "
            "and print current replicas (and where that count came from), forecast peak, target, "
            "delta and cost per endpoint. Nothing is changed, in the cluster or anywhere else. "
            "Without --fleet the fleet is read from the cluster of the current kubeconfig context "
            "(or the in-cluster service account): RegionPools, ModelDeployments, and replicas now "
            "from each ModelDeployment's status.regions[].current, else its serving Deployment's "
            "spec.replicas, else minInstances. Invalid objects are skipped with a warning on "
            "stderr; an unreachable cluster exits with code 2."
        ),
    )
    p.add_argument(
        "--fleet",
        type=Path,
        nargs="+",
        metavar="PATH",
        help="read RegionPool and ModelDeployment YAML files or directories instead of the "
        "cluster (replicas now: minInstances unless --current)",
    )
    p.add_argument(
        "--prometheus",
        metavar="URL",
        help="read the history from this Prometheus (without it every region holds)",
    )
    p.add_argument(
        "--namespace",
        metavar="NS",
        help="only ModelDeployments of this namespace: from the cluster, read only these (the "
        "capacity other namespaces hold in shared pools comes from the pools' status); with "
        "--fleet, show only these rows",
    )
    p.add_argument("--at", help="plan as of this time: RFC 3339 or epoch seconds (default now)")
    p.add_argument(
        "--current",
        type=Path,
        metavar="FILE",
        help="replicas now, YAML/JSON {namespace/name: {pool: n}}; overrides the counts it names",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)
