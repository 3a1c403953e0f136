"""Reconcile one ModelDeployment: a Deployment, Service and ConfigMap per region, then status.

The steps, in order:
1. parse the spec; an invalid one gets a Degraded condition and its status drops the plan (the
   planner leaves it out); no child is touched;
2. resolve each region's RegionPool and the TenantPolicy that applies; render the fairness config;
3. apply every child (create, correct drift, or leave alone), config first;
4. delete children of regions no longer listed;
5. write status and conditions, and an Event for every action and every new problem.
A region whose pool is missing or invalid keeps whatever children it has: taking serving capacity
away because a pool object is briefly absent (a GitOps re-sync, say) would be worse than waiting.
A Deployment created before unique label values keeps its (immutable) selector and its Service
selects what it selects; that is reported (Degraded, reason LegacySelector) without making the
ModelDeployment not Ready, since it serves as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec, RegionPlacement
from fleetwarden.fairness.config import CONFIG_FILE_NAME
from fleetwarden.operator import builders, conditions, naming
from fleetwarden.operator.accounting_cache import AccountingCache, fleet_accounting
from fleetwarden.operator.applier import Action, apply
from fleetwarden.operator.conditions import LEGACY_SELECTOR, ConditionUpdate
from fleetwarden.operator.config_push import DesiredConfig, owned_pod
from fleetwarden.operator.events import NORMAL
from fleetwarden.operator.fairness_render import (
    PolicyChoice,
    PolicyRef,
    choose_policy,
    render_fairness_config,
)
from fleetwarden.operator.fleet import (
    FleetView,
    ObjectRecord,
    parse_model_deployment,
    parse_pool,
    planned_replicas,
    starting_replicas,
)
from fleetwarden.operator.kube import (
    CONFIG_MAPS,
    DEPLOYMENTS,
    MODEL_DEPLOYMENTS,
    PODS,
    SERVICES,
    KubeApiError,
)
from fleetwarden.operator.plan_status import (
    PLAN_EVENT,
    apply_plan_status,
    kept_regions_plan_status,
    target_instances,
)
from fleetwarden.operator.reconcilers.cleanup import delete_unwanted_children
from fleetwarden.operator.reconcilers.context import Context, invalid_spec, write_status
from fleetwarden.operator.served_names import ServedNameIndex, served_name_conflicts
from fleetwarden.operator.sidecar_secret import SidecarSecretError, ensure_sidecar_secret
from fleetwarden.operator.spot_deployments import reconcile_spot, spot_name
from fleetwarden.scaling import DecisionReason

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class Problem:
    reason: str
    message: str
    blocks_ready: bool = True
    """False for a problem that leaves serving as it was (Degraded, but Ready may be True)."""


@dataclass(frozen=True)
class _Resolution:
    targets: list[builders.RegionTarget]
    outcomes: dict[str, _RegionOutcome]
    config_version: str
    tenant_policy: str | None


@dataclass
class _RegionOutcome:
    pool: str
    utilization: float | None = None
    scaling_reason: str | None = None
    region: str | None = None
    gpu_type: str | None = None
    deployment: str | None = None
    replicas: int = 0
    ready: int = 0
    rolling: bool = False
    spot_replicas: int | None = None


def _deployment_progress(live: JsonDict, replicas: int) -> tuple[int, bool]:
    """(ready pods, still rolling out) from a live Deployment's status."""
    status = live.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    generation = int(live.get("metadata", {}).get("generation") or 0)
    observed = int(status.get("observedGeneration") or 0)
    updated = int(status.get("updatedReplicas") or 0)
    rolling = observed < generation or updated < replicas or ready < replicas
    return ready, rolling


async def reconcile_model_deployment(
    ctx: Context,
    view: FleetView,
    key: str,
    accounting: AccountingCache | None = None,
    served_names: ServedNameIndex | None = None,
    policy: PolicyChoice | None = None,
) -> None:
    """Bring the children and status of ModelDeployment `key` in line with its spec.

    `accounting` keeps the fleet's pool accounting and `served_names` its ModelDeployments by
    served name between reconciles (the runtime passes its own); without them both are computed
    afresh from `view`. `policy` is the TenantPolicy choice for this record, resolved by the
    caller from this same `view` (the runtime resolves it first, to note whose pods these are);
    None resolves it here.
    """
    record = view.model_deployments.get(key)
    if record is None:
        return
    parsed = parse_model_deployment(record)
    if parsed.spec is None:  # the planner leaves it out too: its status shows no plan
        plan, plan_updates = kept_regions_plan_status(ctx.plans, record.key, record.status)
        updates = invalid_spec(parsed.error or "invalid spec") + plan_updates
        await write_status(ctx, MODEL_DEPLOYMENTS, record, plan, updates)
        return
    spec = parsed.spec
    problems: list[Problem] = []
    if policy is None:
        policy = choose_policy(view.policy_refs(record.namespace, record.labels))
    resolution = await _resolve_regions(ctx, view, record, spec, policy, problems)

    for shortfall in fleet_accounting(view, accounting).shortfalls_of(record.key):
        problems.append(Problem(conditions.INSUFFICIENT_POOL_CAPACITY, shortfall.message))
    for message in served_name_conflicts(view, record, spec, served_names):
        problems.append(Problem(conditions.SERVED_NAME_CONFLICT, message))

    if resolution.targets:
        await _push_config(ctx, record, resolution, problems)
    for target in resolution.targets:
        outcome = resolution.outcomes[target.placement.pool]
        await _apply_region(ctx, record, target, outcome, problems)

    spot = await reconcile_spot(ctx, view, record, resolution.targets)
    problems += [Problem(conditions.APPLY_FAILED, error) for error in spot.errors]
    problems += [Problem(LEGACY_SELECTOR, notice, blocks_ready=False) for notice in spot.notices]
    for pool, spot_replicas in spot.replicas.items():
        resolution.outcomes[pool].spot_replicas = spot_replicas

    if resolution.targets:
        await _sync_pods(ctx, record, spec, problems)
    await _delete_stale_children(ctx, record, spec, problems)
    await _write_status(ctx, record, resolution, problems)


async def _apply_region(
    ctx: Context,
    record: ObjectRecord,
    target: builders.RegionTarget,
    outcome: _RegionOutcome,
    problems: list[Problem],
) -> None:
    """Apply one region's ConfigMap, Deployment and Service, in that order. The Service selects
    what the live Deployment selects (one from before unique selectors keeps its own, see
    `builders.keep_selector`), so it is left as it is when the Deployment could not be applied."""
    config_map, deployment, service = builders.build_children(target)
    selector: dict[str, str] | None = None
    for desired in (config_map, deployment, service):
        if desired is service:
            if selector is None:
                return
            desired = builders.with_selector(service, selector)
        adjust = builders.keep_selector if desired is deployment else None
        try:
            applied = await apply(ctx.kube, desired, adjust)
        except KubeApiError as exc:
            problems.append(
                Problem(conditions.APPLY_FAILED, f"{desired['kind']} {target.name}: {exc}")
            )
            continue
        if applied.action is not Action.UNCHANGED:
            ctx.events.post(record, NORMAL, str(applied.action), applied.describe())
        if desired is deployment:
            outcome.ready, outcome.rolling = _deployment_progress(applied.live, target.replicas)
            selector = builders.plain_selector(applied.live)
            if selector is not None and selector != target.selector:
                message = builders.kept_selector_message(target.name, selector)
                problems.append(Problem(LEGACY_SELECTOR, message, blocks_ready=False))


async def _push_config(
    ctx: Context, record: ObjectRecord, resolution: _Resolution, problems: list[Problem]
) -> None:
    """Ensure the sidecars' Secret, then tell the pusher which config the live pods must run."""
    owner = resolution.targets[0].owner
    try:
        values, created = await ensure_sidecar_secret(ctx.kube, owner)
    except (KubeApiError, SidecarSecretError) as exc:
        problems.append(Problem(conditions.APPLY_FAILED, f"Secret of the sidecars: {exc}"))
        return
    if created:
        ctx.events.post(
            record, NORMAL, "Created", f"Created Secret {naming.secret_name(owner.name)}"
        )
    target = resolution.targets[0]
    ctx.pusher.set_desired(
        record.key,
        DesiredConfig(target.config_version, target.config_document, values.admin_token),
    )


async def _sync_pods(
    ctx: Context, record: ObjectRecord, spec: ModelDeploymentSpec, problems: list[Problem]
) -> None:
    """Tell the pusher which serving pods exist and which are ready (a server-side selected
    list, not a cluster-wide pod watch: this runs whenever a child Deployment's status moves,
    which is exactly when pods become ready or go away). Only pods of this ModelDeployment's own
    Deployments count: the selector also lists pods labelled with a value from before unique
    values, which another ModelDeployment's pods may carry."""
    try:
        pods = await ctx.kube.list(
            PODS, record.namespace, label_selector=naming.children_selector(record.name)
        )
    except KubeApiError as exc:
        problems.append(Problem(conditions.APPLY_FAILED, f"listing the serving pods: {exc}"))
        return
    pools = [placement.pool for placement in spec.regions]
    deployments = {naming.child_name(record.name, pool) for pool in pools}
    deployments |= {spot_name(record.name, pool) for pool in pools}
    label = naming.label_value(record.name)
    ctx.pusher.sync_pods(record.key, [p for p in pods if owned_pod(p, deployments, label)])


def _scaled_replicas(
    ctx: Context,
    record: ObjectRecord,
    spec: ModelDeploymentSpec,
    placement: RegionPlacement,
    outcome: _RegionOutcome,
) -> int:
    """This region's replicas: the last decision, moved by the scaler when a signal is fresh."""
    replicas = planned_replicas(record, placement)
    if ctx.autoscaler is None:
        return replicas
    signal = ctx.autoscaler.signals.get((record.key, placement.pool))
    if signal is not None:
        outcome.utilization = signal.utilisation
    starting = starting_replicas(record, placement, replicas)
    step = ctx.autoscaler.step(record.key, spec, placement, replicas, ctx.clock(), starting)
    outcome.scaling_reason = (
        step.decision.reason if step else DecisionReason.MISSING_UTILISATION
    ).value
    if step is None or step.after == step.before:
        return replicas
    ctx.events.post(
        record,
        NORMAL,
        "Scaled",
        f"{placement.pool}: {step.before} -> {step.after} replicas ({step.decision.reason.value})",
    )
    return step.after


def _keep_previous(record: ObjectRecord, outcome: _RegionOutcome) -> None:
    """Carry the last status of a region whose pool is missing or invalid into this one.

    Its children are left alone, so their replicas are still the last decision. Writing 0 instead
    would be read back by `planned_replicas` when the pool returns, clamped up to `minInstances`,
    and the Deployment scaled down to that: GPU pods killed because a pool object blinked.
    """
    for region in record.status.get("regions") or []:
        if region.get("pool") != outcome.pool:
            continue
        if isinstance(region.get("current"), int):
            outcome.replicas = region["current"]
        if isinstance(region.get("ready"), int):
            outcome.ready = region["ready"]
        return


async def _applied_config(
    ctx: Context, record: ObjectRecord, spec: ModelDeploymentSpec
) -> tuple[str, str] | None:
    """(document, version) of the fairness config the ConfigMaps hold now, or None when no
    region has one yet. The ConfigMap, not memory, so that it survives an operator restart."""
    for placement in spec.regions:
        name = naming.config_map_name(record.name, placement.pool)
        try:
            live = await ctx.kube.get(CONFIG_MAPS, name, record.namespace)
        except KubeApiError:
            continue
        document = ((live or {}).get("data") or {}).get(CONFIG_FILE_NAME)
        annotations = (live or {}).get("metadata", {}).get("annotations") or {}
        version = annotations.get(naming.CONFIG_VERSION_ANNOTATION)
        if isinstance(document, str) and isinstance(version, str):
            return document, version
    return None


async def _fairness_config(
    ctx: Context,
    record: ObjectRecord,
    spec: ModelDeploymentSpec,
    winner: PolicyRef | None,
    problems: list[Problem],
) -> tuple[str, str]:
    """(document, version) to run: rendered from `winner`, or, when the selecting policy is
    invalid, the config applied last, so a bad TenantPolicy edit never reaches live sidecars."""
    if winner is None or winner.spec is not None:
        config = render_fairness_config(spec, winner)
        return config.to_document(), config.version
    kept = await _applied_config(ctx, record, spec)
    outcome = "the fairness config applied last is kept"
    if kept is None:
        outcome = "no config was applied yet, so the sidecar defaults apply"
        config = render_fairness_config(spec, None)
        kept = config.to_document(), config.version
    problems.append(
        Problem(
            conditions.POLICY_INVALID,
            f"TenantPolicy {winner.name} selects this ModelDeployment but is invalid "
            f"({winner.error}); {outcome}",
        )
    )
    return kept


async def _resolve_regions(
    ctx: Context,
    view: FleetView,
    record: ObjectRecord,
    spec: ModelDeploymentSpec,
    choice: PolicyChoice,
    problems: list[Problem],
) -> _Resolution:
    if choice.losers and choice.winner is not None:
        names = ", ".join(p.name for p in choice.losers)
        problems.append(
            Problem(
                conditions.POLICY_CONFLICT,
                f"TenantPolicies {choice.winner.name}, {names} all select this ModelDeployment; "
                f"{choice.winner.name} (the oldest) applies",
            )
        )
    document, version = await _fairness_config(ctx, record, spec, choice.winner, problems)
    owner = builders.Owner(name=record.name, namespace=record.namespace or "", uid=record.uid)

    targets: list[builders.RegionTarget] = []
    outcomes: dict[str, _RegionOutcome] = {}
    for placement in spec.regions:
        outcome = outcomes[placement.pool] = _RegionOutcome(pool=placement.pool)
        pool_record = view.pools.get(placement.pool)
        if pool_record is None:
            problems.append(
                Problem(conditions.POOL_NOT_FOUND, f"RegionPool {placement.pool} does not exist")
            )
            _keep_previous(record, outcome)
            continue
        pool = parse_pool(pool_record)
        if pool.spec is None:
            problems.append(
                Problem(conditions.POOL_INVALID, f"RegionPool {placement.pool}: {pool.error}")
            )
            _keep_previous(record, outcome)
            continue
        if pool.spec.gpu_type not in spec.throughput:
            problems.append(
                Problem(
                    conditions.THROUGHPUT_MISSING,
                    f"throughput has no entry for GPU type {pool.spec.gpu_type} of pool "
                    f"{placement.pool}; the planner cannot size this region",
                )
            )
        target = builders.RegionTarget(
            owner=owner,
            spec=spec,
            placement=placement,
            pool=pool.spec,
            replicas=_scaled_replicas(ctx, record, spec, placement, outcome),
            sidecar_image=ctx.sidecar_image,
            config_document=document,
            config_version=version,
        )
        outcome.region, outcome.gpu_type = pool.spec.region, pool.spec.gpu_type
        outcome.deployment, outcome.replicas = target.name, target.replicas
        targets.append(target)
    winner = choice.winner.name if choice.winner is not None else None
    return _Resolution(targets, outcomes, version, winner)


async def _delete_stale_children(
    ctx: Context, record: ObjectRecord, spec: ModelDeploymentSpec, problems: list[Problem]
) -> None:
    """Delete children of regions that were removed from the spec (and only those)."""
    listed = {naming.label_value(r.pool) for r in spec.regions}

    def unwanted(name: str, pool: str | None) -> str | None:
        return None if pool in listed else f"pool {pool} is no longer in spec.regions"

    kinds = (SERVICES, DEPLOYMENTS, CONFIG_MAPS)
    selector = naming.children_selector(record.name)
    for error in await delete_unwanted_children(ctx, record, kinds, selector, unwanted):
        problems.append(Problem(conditions.APPLY_FAILED, error))


def _condition_updates(
    outcomes: dict[str, _RegionOutcome], problems: list[Problem]
) -> list[ConditionUpdate]:
    blocking = [p for p in problems if p.blocks_ready]
    problems = blocking + [p for p in problems if not p.blocks_ready]
    degraded = ConditionUpdate(
        conditions.DEGRADED,
        bool(problems),
        problems[0].reason if problems else conditions.AS_EXPECTED,
        "; ".join(p.message for p in problems) if problems else "",
    )
    rolling = [o.pool for o in outcomes.values() if o.rolling]
    progressing = ConditionUpdate(
        conditions.PROGRESSING,
        bool(rolling),
        conditions.ROLLING_OUT if rolling else conditions.AS_EXPECTED,
        f"rolling out in {', '.join(rolling)}" if rolling else "",
    )
    not_ready = [
        f"{o.pool} {o.ready}/{o.replicas}"
        for o in outcomes.values()
        if o.deployment is not None and o.ready < o.replicas
    ]
    if blocking:
        ready = ConditionUpdate(conditions.READY, False, blocking[0].reason, blocking[0].message)
    elif not_ready:
        ready = ConditionUpdate(
            conditions.READY,
            False,
            conditions.PODS_NOT_READY,
            "ready pods: " + ", ".join(not_ready),
        )
    else:
        ready = ConditionUpdate(
            conditions.READY, True, conditions.RECONCILED, "every region serves its replicas"
        )
    return [ready, progressing, degraded]


async def _write_status(
    ctx: Context,
    record: ObjectRecord,
    resolution: _Resolution,
    problems: list[Problem],
) -> None:
    outcomes = resolution.outcomes
    previous_regions = {r.get("pool"): r for r in record.status.get("regions") or []}
    regions = []
    for outcome in outcomes.values():
        region: JsonDict = dict(previous_regions.get(outcome.pool) or {})
        region.update({"pool": outcome.pool, "current": outcome.replicas, "ready": outcome.ready})
        if outcome.utilization is not None:
            region["utilization"] = round(outcome.utilization, 4)
        region.pop("scalingReason", None)
        if outcome.scaling_reason is not None:
            region["scalingReason"] = outcome.scaling_reason
        region.pop("spotReplicas", None)
        if outcome.spot_replicas is not None:
            region["spotReplicas"] = outcome.spot_replicas
        for key, value in (
            ("region", outcome.region),
            ("gpuType", outcome.gpu_type),
            ("deployment", outcome.deployment),
        ):
            if value is not None:
                region[key] = value
        regions.append(region)
    plan_updates, plan_event = apply_plan_status(ctx.plans, record.key, regions)
    if plan_event is not None:
        ctx.events.post(record, NORMAL, PLAN_EVENT, plan_event)
    status: JsonDict = {
        "regions": regions,
        "regionCount": len(regions),
        "instances": sum(o.replicas for o in outcomes.values()),
        "readyInstances": sum(o.ready for o in outcomes.values()),
        "targetInstances": target_instances(regions),
        "configVersion": resolution.config_version,
        "tenantPolicy": resolution.tenant_policy,
    }
    updates = _condition_updates(outcomes, problems) + plan_updates
    health = ctx.autoscaler.health_of(record.key) if ctx.autoscaler is not None else None
    if health is not None:
        updates.append(ConditionUpdate(conditions.SCALING, *health))
    await write_status(ctx, MODEL_DEPLOYMENTS, record, status, updates)
