"""Two ModelDeployments serving one model name in one region would share their series.

Every signal the control loop reads is keyed by served model and region: the sidecars' metrics
(`{model, region}` labels), hence utilisation, tokens/s history, forecasts, the scaler's input,
the NIW backlog and the batch queue. Two ModelDeployments with the same `servedName` in the same
region (in one namespace or two) would each read the sum of both, and each would scale for the
other's load. Rather than mix them silently, the later one (creation time, then namespace/name,
the same first-come order as pool accounting) is told so in its status and events.

Pure.
"""

from __future__ import annotations

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec
from fleetwarden.operator.fleet import FleetView, ObjectRecord, parse_model_deployment, parse_pool


def served_name_conflicts(
    view: FleetView, record: ObjectRecord, spec: ModelDeploymentSpec
) -> list[str]:
    """One message per earlier ModelDeployment serving `spec.served_name` in a shared region.

    Linear in the fleet: each earlier ModelDeployment's spec is parsed once, and each pool once
    (not once per ModelDeployment naming it).
    """
    pool_regions: dict[str, str | None] = {}

    def regions(of: ModelDeploymentSpec) -> set[str]:
        found = set()
        for placement in of.regions:
            if placement.pool not in pool_regions:
                pool_record = view.pools.get(placement.pool)
                pool = parse_pool(pool_record).spec if pool_record is not None else None
                pool_regions[placement.pool] = pool.region if pool is not None else None
            region = pool_regions[placement.pool]
            if region is not None:
                found.add(region)
        return found

    mine = regions(spec)
    order = (record.created, record.key)
    messages = []
    for other in sorted(view.model_deployments.values(), key=lambda r: (r.created, r.key)):
        if other.key == record.key or (other.created, other.key) > order:
            continue
        other_spec = parse_model_deployment(other).spec
        if other_spec is None or other_spec.served_name != spec.served_name:
            continue
        shared = sorted(mine & regions(other_spec))
        if shared:
            messages.append(
                f"ModelDeployment {other.key} (older) also serves model {spec.served_name!r} in "
                f"{', '.join(shared)}: metrics, forecasts, scaling signals and the batch queue are "
                "keyed by served model and region, so both would read the sum of their loads; "
                "give this one another servedName"
            )
    return messages


__all__ = ["served_name_conflicts"]
