"""Read the fleet from a live cluster for `fleetwarden plan`, through the operator's own client.

Why in the operator layer: the API client (`kube.py`, kubeconfig or in-cluster config) and the
rule for what is plannable (`hourly_planner.snapshot`: which ModelDeployments are left out and
what capacity their replicas reserve in the pools) live here, so the dry run sees the cluster the
way the operator's hourly round does, not through a second parser that could drift from it.

Only GET requests are made: RegionPools (cluster-scoped), ModelDeployments (all namespaces, or
one), and the serving Deployment of an endpoint whose status has no `current`. Replicas now, per
(ModelDeployment, pool), come from the first of:

1. `status.regions[].current`: the operator's own decision, which it keeps Deployments at;
2. the serving Deployment's `spec.replicas`: the operator has not written status yet;
3. `minInstances`: there is no Deployment either (a ModelDeployment not reconciled yet).

Invalid objects are not errors: a RegionPool whose spec does not parse holds nothing, a
ModelDeployment that cannot be planned is left out with its replicas reserved in its pools, and
each gives one warning line naming it (a dry run that crashed on one bad object would tell the
user less than the operator's own round, which plans around it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
from kubernetes.aio.config import ConfigException

from fleetwarden.forecasting.hourly import PoolUsage
from fleetwarden.operator.fleet import FleetView, ObjectRecord, parse_pool
from fleetwarden.operator.hourly_planner import FleetSnapshot, snapshot
from fleetwarden.operator.kube import (
    DEPLOYMENTS,
    MODEL_DEPLOYMENTS,
    REGION_POOLS,
    KubeApiError,
    KubeClient,
)
from fleetwarden.operator.naming import child_name

CurrentSource = Literal["status", "deployment", "minInstances"]
EndpointKey = tuple[str, str]
"""(ModelDeployment `namespace/name`, pool)."""


class ClusterReadError(Exception):
    """The fleet could not be read: no cluster configuration, cluster unreachable, API error."""


@dataclass(frozen=True)
class ClusterFleet:
    """The plannable fleet as the operator's round would see it, and where each count came from."""

    snapshot: FleetSnapshot
    """Specs, replicas now, capacity reserved by left-out ModelDeployments, and why they are."""
    current_source: Mapping[EndpointKey, CurrentSource]
    """Per endpoint of `snapshot.specs`: which of status, Deployment or minInstances gave
    `snapshot.current`."""
    warnings: tuple[str, ...] = field(default_factory=tuple)
    """One line per skipped object, naming it."""


def _status_current(record: ObjectRecord, pool: str) -> tuple[int | None, str | None]:
    """`status.regions[pool].current` (None when absent) and the Deployment name status gives."""
    for region in record.status.get("regions") or []:
        if isinstance(region, Mapping) and region.get("pool") == pool:
            current = region.get("current")
            deployment = region.get("deployment")
            return (
                current if isinstance(current, int) and not isinstance(current, bool) else None,
                deployment if isinstance(deployment, str) and deployment else None,
            )
    return None, None


def _foreign_allocations(pools: Mapping[str, ObjectRecord], namespace: str) -> dict[str, PoolUsage]:
    """Capacity the pools' status says ModelDeployments outside `namespace` hold.

    With `--namespace` only that namespace's ModelDeployments are read (what namespace-scoped RBAC
    allows), but pools are shared: without this the plan would hand the other namespaces' GPUs
    out a second time. The operator keeps `status.allocations` per pool up to date.
    """
    out: dict[str, PoolUsage] = {}
    for name, record in pools.items():
        instances = gpus = 0
        for entry in record.status.get("allocations") or []:
            if not isinstance(entry, Mapping):
                continue
            owner = str(entry.get("modelDeployment", ""))
            if owner.startswith(f"{namespace}/"):
                continue
            instances += _count(entry.get("instances"))
            gpus += _count(entry.get("gpus"))
        if instances or gpus:
            out[name] = PoolUsage(instances, gpus)
    return out


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


async def read_fleet(kube: KubeClient, namespace: str | None = None) -> ClusterFleet:
    """List the fleet and work out replicas now; raises KubeApiError on API errors."""
    pool_records = [ObjectRecord.from_body(b) for b in await kube.list(REGION_POOLS)]
    md_records = [ObjectRecord.from_body(b) for b in await kube.list(MODEL_DEPLOYMENTS, namespace)]
    view = FleetView.of(pools=pool_records, model_deployments=md_records)
    snap = snapshot(view)

    warnings = []
    for name, record in sorted(view.pools.items()):
        error = parse_pool(record).error
        if error is not None:
            warnings.append(f"RegionPool {name} skipped: {error}")
    warnings += [
        f"ModelDeployment {key} skipped (its replicas are held): {reason}"
        for key, reason in sorted(snap.skipped.items())
    ]

    current: dict[EndpointKey, int] = {}
    source: dict[EndpointKey, CurrentSource] = {}
    for key, spec in sorted(snap.specs.model_deployments.items()):
        record = view.model_deployments[key]
        for placement in spec.regions:
            endpoint = (key, placement.pool)
            n, deployment_name = _status_current(record, placement.pool)
            if n is not None:
                current[endpoint], source[endpoint] = n, "status"
                continue
            deployment = await kube.get(
                DEPLOYMENTS,
                deployment_name or child_name(record.name, placement.pool),
                record.namespace,
            )
            replicas = ((deployment or {}).get("spec") or {}).get("replicas")
            if isinstance(replicas, int) and not isinstance(replicas, bool):
                current[endpoint], source[endpoint] = replicas, "deployment"
            else:
                current[endpoint], source[endpoint] = placement.min_instances, "minInstances"

    reserved = dict(snap.reserved)
    if namespace is not None:
        for pool, usage in _foreign_allocations(view.pools, namespace).items():
            before = reserved.get(pool, PoolUsage())
            reserved[pool] = PoolUsage(before.instances + usage.instances, before.gpus + usage.gpus)
    fleet = FleetSnapshot(snap.specs, current, reserved, dict(snap.skipped))
    return ClusterFleet(fleet, source, tuple(warnings))


async def _connect_and_read(namespace: str | None) -> ClusterFleet:
    try:
        kube = await KubeClient.connect()
    except (ConfigException, OSError, ValueError) as exc:
        raise ClusterReadError(
            f"no cluster configuration (kubeconfig or in-cluster): {exc}"
        ) from exc
    try:
        return await read_fleet(kube, namespace)
    except KubeApiError as exc:
        raise ClusterReadError(f"the API server refused: {exc}") from exc
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise ClusterReadError(f"cluster unreachable: {exc}") from exc
    finally:
        await kube.close()


def read_cluster_fleet(namespace: str | None = None) -> ClusterFleet:
    """Blocking entry point for the command line (it has no event loop of its own)."""
    return asyncio.run(_connect_and_read(namespace))
