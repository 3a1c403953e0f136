"""Spot Deployments: per region, a copy of the serving pods on the pool's spot nodes, for NIW work.

When a ModelDeployment sets `niw.spot.enabled` and its RegionPool has `spot.enabled`, the operator
keeps `<md>-<pool>-spot` (a Deployment and a Service) next to the serving Deployment. Its replicas
follow the region's NIW backlog through `fleetwarden.scaling.spot.spot_replicas`: zero when nothing is
queued or running, up to `niw.spot.maxInstances`. The pool's `spot.maxInstances` bounds the pool:
when several ModelDeployments want spot replicas on one pool, they share its bound max-min fairly
(`fleetwarden.scaling.spot.share_spot_capacity`), each reconcile computing the same split.

The pods are the serving pods with four differences, each for a reason:

- node selector and tolerations: the spot selector replaces the pool's (spot nodes are another
  node group, whose labels may not match the on-demand ones), and the spot tolerations are added
  to the pool's (tolerations only allow, and spot GPU nodes usually carry the GPU taint too);
- labels: the pods carry `fleetwarden.dev/spot-pool` instead of `fleetwarden.dev/pool`, so the
  serving Deployment's selector and Service never match them (interactive traffic must not land
  on capacity the cloud can take away, and two Deployments must not own the same pods);
- component `spot` and no scrape annotations: their sidecars report the same `{model, region}`
  labels as the serving sidecars, and averaging them into the region's utilisation would feed the
  release rule and the scaler with load that is not interactive;
- replicas: from the backlog, not from the planner.

The Deployment and Service objects keep the `fleetwarden.dev/pool` label, so removing the region
from the spec removes them with the serving children. Without Prometheus the operator cannot see
the backlog: it creates no spot Deployment and leaves existing ones at their replicas. A spot
Deployment from before unique label values keeps its selector, as a serving one does
(`builders.keep_selector`), and its Service selects what it selects.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec, RegionPoolSpec
from fleetwarden.operator import naming
from fleetwarden.operator.applier import Action, Adjust, apply
from fleetwarden.operator.builders import (
    RegionTarget,
    build_deployment,
    build_service,
    keep_selector,
    kept_selector_message,
    plain_selector,
    with_selector,
)
from fleetwarden.operator.events import NORMAL
from fleetwarden.operator.fleet import FleetView, ObjectRecord, parse_model_deployment
from fleetwarden.operator.kube import DEPLOYMENTS, SERVICES, KubeApiError
from fleetwarden.operator.reconcilers.cleanup import delete_unwanted_children
from fleetwarden.operator.reconcilers.context import Context
from fleetwarden.operator.spot_signals import BacklogSignal
from fleetwarden.scaling.spot import SpotDemand, SpotSizing, share_spot_capacity, spot_replicas

JsonDict = dict[str, Any]

SPOT_COMPONENT = "spot"
SPOT_LABEL = "fleetwarden.dev/spot"
"""`"true"` on spot children, so they can be listed apart from the serving ones."""
SPOT_POOL_LABEL = "fleetwarden.dev/spot-pool"
"""The pool of a spot pod (instead of `fleetwarden.dev/pool`, see the module docstring)."""
DEFAULT_TOKENS_PER_ITEM = 1024.0
"""Mean tokens of one NIW item until the batch service has completed some (prompt + answer of
a typical summarisation item); only the first sizing after a start depends on it."""


def spot_name(model_deployment: str, pool: str) -> str:
    """`<modeldeployment>-<pool>-spot`, shortened with a stable hash like `naming.child_name`."""
    name = f"{naming.child_name(model_deployment, pool)}-spot"
    if len(name) <= naming.MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: naming.MAX_NAME - 14].rstrip('-')}-{digest}-spot"


def spot_selector(model_deployment: str, pool: str) -> dict[str, str]:
    """The spot Deployment's (immutable) selector and its Service's."""
    return {
        naming.MODEL_DEPLOYMENT_LABEL: naming.label_value(model_deployment),
        SPOT_POOL_LABEL: naming.label_value(pool),
    }


def spot_children_selector(model_deployment: str) -> str:
    """Label selector (text form) of every spot child of one ModelDeployment."""
    return f"{naming.children_selector(model_deployment)},{SPOT_LABEL}=true"


def _pod_labels(target: RegionTarget) -> dict[str, str]:
    labels = {k: v for k, v in target.labels.items() if k != naming.POOL_LABEL}
    labels[naming.COMPONENT] = SPOT_COMPONENT
    labels.update(spot_selector(target.owner.name, target.placement.pool))
    return labels


def _object_labels(target: RegionTarget) -> dict[str, str]:
    return {**target.labels, naming.COMPONENT: SPOT_COMPONENT, SPOT_LABEL: "true"}


def build_spot_deployment(target: RegionTarget, replicas: int) -> JsonDict:
    """The serving Deployment of `target`, moved to spot nodes and relabelled."""
    deployment = copy.deepcopy(build_deployment(target))
    name = spot_name(target.owner.name, target.placement.pool)
    selector = spot_selector(target.owner.name, target.placement.pool)
    spot = target.pool.spot
    deployment["metadata"]["name"] = name
    deployment["metadata"]["labels"] = _object_labels(target)
    spec = deployment["spec"]
    spec["replicas"] = replicas
    spec["selector"] = {"matchLabels": selector}
    template = spec["template"]
    template["metadata"] = {"labels": _pod_labels(target)}
    pod = template["spec"]
    pod["nodeSelector"] = dict(spot.node_selector or target.pool.node_selector)
    pod["tolerations"] = [
        *pod["tolerations"],
        *(t.to_k8s() for t in spot.tolerations if t.to_k8s() not in pod["tolerations"]),
    ]
    for constraint in pod.get("topologySpreadConstraints", []):
        constraint["labelSelector"] = {"matchLabels": selector}
    return deployment


def build_spot_service(target: RegionTarget) -> JsonDict:
    """The endpoint the batch service's spot target calls (`http://<name>.<namespace>.svc`)."""
    service = build_service(target)
    service["metadata"]["name"] = spot_name(target.owner.name, target.placement.pool)
    service["metadata"]["labels"] = _object_labels(target)
    service["spec"]["selector"] = spot_selector(target.owner.name, target.placement.pool)
    return service


def spot_wanted(spec: ModelDeploymentSpec, pool: RegionPoolSpec) -> bool:
    """Whether a region gets a spot Deployment: both the model and the pool allow spot."""
    return spec.niw.spot.enabled and pool.spot.enabled


def max_spot_replicas(spec: ModelDeploymentSpec, pool: RegionPoolSpec) -> int:
    """The model's `niw.spot.maxInstances`, within the pool's `spot.maxInstances` if given."""
    bound = spec.niw.spot.max_instances
    if pool.spot.max_instances is not None:
        bound = min(bound, pool.spot.max_instances)
    return bound


def decide_spot_replicas(
    spec: ModelDeploymentSpec, pool: RegionPoolSpec, signal: BacklogSignal
) -> int:
    """Replicas for the current backlog (pure).

    One replica's items/s is the instance's tokens/s for the pool's GPU type over the mean tokens
    of an item. Shared capacity is not subtracted: the batch service's completion counter does
    not tell shared from spot completions, so subtracting it would count the spot pods' own work
    and scale them down while they work. Spot is sized to meet the deadlines on its own.
    """
    throughput = spec.throughput.get(pool.gpu_type)
    if throughput is None or throughput <= 0:
        return 0
    per_item = signal.tokens_per_item or DEFAULT_TOKENS_PER_ITEM
    sizing = SpotSizing(
        items_per_replica_per_s=throughput / max(per_item, 1.0),
        max_replicas=max_spot_replicas(spec, pool),
    )
    return spot_replicas(SpotDemand(signal.open_items, signal.due), sizing).replicas


SignalLookup = Callable[[str, str], BacklogSignal | None]
"""(served model, region) -> a fresh backlog reading, or None when stale or missing."""


def _status_spot_replicas(record: ObjectRecord, pool: str) -> int:
    """What a ModelDeployment last reported running on `pool`'s spot nodes (0 if nothing)."""
    for region in record.status.get("regions") or []:
        if isinstance(region, dict) and region.get("pool") == pool:
            value = region.get("spotReplicas")
            return value if isinstance(value, int) and value > 0 else 0
    return 0


def pool_spot_shares(
    view: FleetView, pool_name: str, pool: RegionPoolSpec, signals: SignalLookup
) -> dict[str, int]:
    """Spot replicas of every ModelDeployment (by key) that wants spot on `pool_name`.

    Each wants what its own backlog asks (`decide_spot_replicas`); one whose reading is stale
    holds what its status last reported, as its own reconcile would. With a pool bound, the
    wants are split by `share_spot_capacity`, so the bound holds for the whole pool. The sharers
    are `view.model_deployments_using(pool_name)`: in the operator's views, the pool's users as
    the pool-users index lists them (`pool_index`), not a scan of the fleet per spot region.
    """
    wants: dict[str, int] = {}
    for record in view.model_deployments_using(pool_name):
        spec = parse_model_deployment(record).spec
        if spec is None or not spot_wanted(spec, pool):
            continue
        signal = signals(spec.served_name, pool.region)
        wants[record.key] = (
            decide_spot_replicas(spec, pool, signal)
            if signal is not None
            else _status_spot_replicas(record, pool_name)
        )
    if pool.spot.max_instances is None:
        return wants
    return share_spot_capacity(pool.spot.max_instances, wants)


@dataclass
class SpotOutcome:
    """What one reconcile did: spot replicas per pool (regions with a spot Deployment only)."""

    replicas: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    """Spot Deployments that kept a selector from before unique label values."""


def _live_replicas(live: JsonDict | None) -> int | None:
    if live is None:
        return None
    value = (live.get("spec") or {}).get("replicas")
    return value if isinstance(value, int) else 0


async def _region_replicas(
    ctx: Context, view: FleetView, record: ObjectRecord, target: RegionTarget, name: str
) -> int | None:
    """The replicas to apply, or None to leave the region without a spot Deployment."""
    live = _live_replicas(await ctx.kube.get(DEPLOYMENTS, name, record.namespace or ""))
    autoscaler = ctx.autoscaler
    if autoscaler is None:
        return live  # no backlog to follow: keep what exists, create nothing
    now = ctx.clock()
    signal = autoscaler.spot.fresh(target.spec.served_name, target.pool.region, now)
    if signal is None:
        return live if live is not None else 0  # stale or missing reading: hold
    if target.pool.spot.max_instances is None:
        return decide_spot_replicas(target.spec, target.pool, signal)
    shares = pool_spot_shares(
        view,
        target.placement.pool,
        target.pool,
        lambda model, region: autoscaler.spot.fresh(model, region, now),
    )
    return shares.get(record.key, 0)


async def _apply(
    ctx: Context, record: ObjectRecord, desired: JsonDict, adjust: Adjust | None = None
) -> dict[str, str] | None:
    """Apply one spot child, say so in an Event; the live object's plain selector if any."""
    applied = await apply(ctx.kube, desired, adjust)
    if applied.action is not Action.UNCHANGED:
        ctx.events.post(record, NORMAL, str(applied.action), applied.describe())
    return plain_selector(applied.live)


async def reconcile_spot(
    ctx: Context, view: FleetView, record: ObjectRecord, targets: Sequence[RegionTarget]
) -> SpotOutcome:
    """Apply the spot children of every region that wants them; delete the others'."""
    outcome = SpotOutcome()
    wanted: set[str] = set()
    for target in targets:
        if not spot_wanted(target.spec, target.pool):
            continue
        pool = target.placement.pool
        name = spot_name(record.name, pool)
        wanted.add(name)
        try:
            replicas = await _region_replicas(ctx, view, record, target, name)
            if replicas is None:
                continue
            deployment = build_spot_deployment(target, replicas)
            selector = await _apply(ctx, record, deployment, keep_selector)
            if selector is not None:  # else not a selector the operator wrote: Service untouched
                if selector != plain_selector(deployment):
                    outcome.notices.append(kept_selector_message(name, selector))
                await _apply(ctx, record, with_selector(build_spot_service(target), selector))
        except KubeApiError as exc:
            outcome.errors.append(f"spot Deployment {name}: {exc}")
            continue
        outcome.replicas[pool] = replicas
    resolved = {naming.label_value(t.placement.pool) for t in targets}
    await _delete_unwanted(ctx, record, resolved, wanted, outcome)
    return outcome


async def _delete_unwanted(
    ctx: Context, record: ObjectRecord, resolved: set[str], wanted: set[str], outcome: SpotOutcome
) -> None:
    """Delete spot children this ModelDeployment owns but no longer wants (spot disabled on it
    or on the pool). Their in-flight NIW items go back to the queue (see docs/batch.md).

    Only in regions whose pool resolved: like the serving children, a region whose RegionPool is
    briefly missing keeps what it has; a region removed from the spec is cleaned up with its
    serving children (the objects carry its pool label)."""

    def unwanted(name: str, pool: str | None) -> str | None:
        if name in wanted or pool not in resolved:
            return None
        return "spot is no longer enabled for this region"

    outcome.errors += await delete_unwanted_children(
        ctx,
        record,
        (SERVICES, DEPLOYMENTS),
        spot_children_selector(record.name),
        unwanted,
        "spot children",
    )
