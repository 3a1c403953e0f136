"""`fleetwarden batch-targets`: the batch service's `targets` rendered from the fleet.

One shared target per serving region and one spot target per spot Deployment, each carrying its
ModelDeployment's release rule (`niw.releaseAt`, `promoteAfterSeconds`), so the batch service
releases work by the thresholds the ModelDeployment declares, and the tenant header its sidecars
trust (`sidecar.tenantHeader`), so they count each item under its batch's tenant. The fleet comes
from the cluster (read-only, the operator's own reader) or from `--fleet` YAML, like `fleetwarden
plan`. The output is YAML for `batch.config.targets` in the chart's values, validated with the
batch service's own config schema before it is printed. Bad input exits with code 2 and one line
on stderr; regions that cannot get a target (and ModelDeployments whose tenant header the batch
service cannot send) are listed as warnings on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

USAGE_ERROR = 2


def _fail(message: str) -> int:
    print(f"fleetwarden batch-targets: {' '.join(message.split())}", file=sys.stderr)
    return USAGE_ERROR


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from fleetwarden.batch.config import TargetConfig
    from fleetwarden.batch.policy import tenant_header_problem
    from fleetwarden.operator.batch_targets import render_batch_targets
    from fleetwarden.operator.fleet_reader import ClusterReadError
    from fleetwarden.sim.fleet_spec import FleetSpecError

    if not args.prometheus.startswith(("http://", "https://")):
        return _fail(f"--prometheus must be an http(s) URL, got {args.prometheus!r}")
    if args.max_in_flight < 1 or args.spot_max_in_flight < 1:
        return _fail("--max-in-flight and --spot-max-in-flight must be >= 1")
    try:
        if args.fleet:
            from fleetwarden.sim.fleet_spec import load_fleet
            from fleetwarden.sim.forecast_planner import fleet_specs

            specs = fleet_specs(load_fleet(list(args.fleet)))
        else:
            from fleetwarden.operator.fleet_reader import read_cluster_fleet

            cluster = read_cluster_fleet(args.namespace)
            for warning in cluster.warnings:
                print(f"fleetwarden batch-targets: warning: {warning}", file=sys.stderr)
            specs = cluster.snapshot.specs
    except FleetSpecError as exc:
        return _fail(str(exc))
    except ClusterReadError as exc:
        return _fail(f"cannot read the fleet: {exc}")
    models = {
        key: spec
        for key, spec in specs.model_deployments.items()
        if args.namespace is None or key.startswith(f"{args.namespace}/")
    }
    rendered = render_batch_targets(
        specs.pools,
        models,
        prometheus_url=args.prometheus,
        max_in_flight=args.max_in_flight,
        spot_max_in_flight=args.spot_max_in_flight,
        header_problem=tenant_header_problem,
    )
    try:
        for target in rendered.targets:
            TargetConfig.model_validate(target)
    except ValidationError as exc:  # a bug here, not bad input: say so plainly
        return _fail(f"a rendered target does not fit the batch config schema: {exc}")
    for line in rendered.skipped:
        print(f"fleetwarden batch-targets: warning: {line}", file=sys.stderr)
    document: dict[str, Any] = {"targets": rendered.targets}
    print(
        f"# fleetwarden batch-targets: {len(rendered.targets)} targets from "
        f"{len(models)} ModelDeployments; use as batch.config.targets"
    )
    print(yaml.safe_dump(document, sort_keys=False, width=1000), end="")
    return 0


def register(commands: Any) -> None:
    """Add the `batch-targets` command to the top-level parser's subparsers."""
    p = commands.add_parser(
        "batch-targets",
        help="print the batch service's targets for the fleet, with each ModelDeployment's "
        "release rule and tenant header",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--prometheus",
        required=True,
        metavar="URL",
        help="the Prometheus the shared targets read utilisation from (the operator's)",
    )
    p.add_argument(
        "--fleet",
        type=Path,
        nargs="+",
        metavar="PATH",
        help="read RegionPool and ModelDeployment YAML files or directories instead of the cluster",
    )
    p.add_argument("--namespace", metavar="NS", help="only ModelDeployments of this namespace")
    p.add_argument("--max-in-flight", type=int, default=32, help="per shared target")
    p.add_argument("--spot-max-in-flight", type=int, default=32, help="per spot target")
    p.set_defaults(func=run)
