"""The batch service's `targets` as the fleet implies them: one per serving region, one per spot
Deployment, each with its ModelDeployment's release rule.

The batch service is configured by file (it must start and drain without the Kubernetes API), so
its targets used to be written by hand, and a ModelDeployment's `niw.releaseAt` and
`promoteAfterSeconds` had to be copied into the file's single `release` section by hand too.
This renders them from the same specs the operator reconciles: the serving Service of every
region (`naming.child_name`, the Service's port), the spot Service where spot is enabled, the
planner's utilisation query for the region, the rule on each target, and the tenant header the
region's sidecars trust (`spec.sidecar.tenantHeader`: sent under any other name, a batch's tenant
is lost and its items run as tenant `default`). `fleetwarden batch-targets` prints the result for
`batch.config.targets` in the chart's values.

Pure: specs in, plain dicts out (the CLI validates them with the batch service's own schema).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec, RegionPoolSpec
from fleetwarden.metrics import promql
from fleetwarden.operator import naming
from fleetwarden.operator.builders import SERVICE_PORT
from fleetwarden.operator.spot_deployments import spot_name, spot_wanted

JsonDict = dict[str, Any]


@dataclass
class RenderedTargets:
    """The targets and what had to be left out (one line each)."""

    targets: list[JsonDict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _url(service: str, namespace: str) -> str:
    port = "" if SERVICE_PORT == 80 else f":{SERVICE_PORT}"
    return f"http://{service}.{namespace}.svc{port}"


def _release(spec: ModelDeploymentSpec) -> JsonDict:
    one, two = spec.niw.release_at
    return {
        "one_below": one,
        "two_below": two,
        "promote_after_s": float(spec.niw.promote_after_seconds),
    }


def render_batch_targets(
    pools: Mapping[str, RegionPoolSpec],
    model_deployments: Mapping[str, ModelDeploymentSpec],
    *,
    prometheus_url: str,
    max_in_flight: int = 32,
    spot_max_in_flight: int = 32,
    header_problem: Callable[[str], str | None] | None = None,
) -> RenderedTargets:
    """Targets for every region of every ModelDeployment (keyed `namespace/name`).

    The batch service keeps one queue per (served model, region), so a second serving region of
    the same queue (two pools in one region, or one served name in two namespaces) is skipped
    and reported: the first in `namespace/name`, then pool order wins.

    `header_problem` says why the batch service cannot send a tenant header (the caller passes
    the batch config's own check: this layer may not import it); a ModelDeployment whose
    `spec.sidecar.tenantHeader` it refuses gets no targets and is reported, since its sidecars
    could never learn a batch's tenant.
    """
    rendered = RenderedTargets()
    taken: dict[tuple[str, str, str], str] = {}
    for key in sorted(model_deployments):
        spec = model_deployments[key]
        namespace, _, name = key.partition("/")
        tenant_header = spec.sidecar.tenant_header
        problem = header_problem(tenant_header) if header_problem is not None else None
        if problem is not None:
            rendered.skipped.append(
                f"{key}: spec.sidecar.tenantHeader: {problem}; the batch service cannot send "
                "its tenants, so it gets no targets"
            )
            continue
        for placement in spec.regions:
            pool = pools.get(placement.pool)
            if pool is None:
                rendered.skipped.append(f"{key}: RegionPool {placement.pool} not found")
                continue
            where = f"{key} in pool {placement.pool}"
            shared: JsonDict = {
                "model": spec.served_name,
                "region": pool.region,
                "kind": "shared",
                "base_url": _url(naming.child_name(name, placement.pool), namespace),
                "max_in_flight": max_in_flight,
                "utilisation": {
                    "kind": "prometheus",
                    "url": prometheus_url,
                    "query": promql.utilisation(model=spec.served_name, region=pool.region),
                },
                "release": _release(spec),
                "tenant_header": tenant_header.lower(),
            }
            candidates = [shared]
            if spot_wanted(spec, pool):
                candidates.append(
                    {
                        "model": spec.served_name,
                        "region": pool.region,
                        "kind": "spot",
                        "base_url": _url(spot_name(name, placement.pool), namespace),
                        "max_in_flight": spot_max_in_flight,
                        "release": _release(spec),
                        "tenant_header": tenant_header.lower(),
                    }
                )
            for target in candidates:
                slot = (target["model"], target["region"], target["kind"])
                if slot in taken:
                    rendered.skipped.append(
                        f"{where}: the {target['kind']} target of model {slot[0]} in region "
                        f"{slot[1]} is already {taken[slot]}'s (one queue per model and region)"
                    )
                    continue
                taken[slot] = where
                rendered.targets.append(target)
    return rendered


__all__ = ["RenderedTargets", "render_batch_targets"]
