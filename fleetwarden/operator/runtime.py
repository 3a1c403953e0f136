"""The operator's running state: the fleet snapshot source and coalesced reconcile requests.

Many events ask for the same reconcile (a ModelDeployment's own change, each of its children's
status updates, its pools' changes). `Coalescer` runs at most one reconcile per object at a time and
folds every request that arrives meanwhile into one more run, so an event storm costs two passes, not
hundreds. A failed pass is retried with capped exponential backoff; Kopf's own retries do not apply
because the reconcile runs outside the handler that requested it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetwarden.operator.accounting_cache import AccountingCache
from fleetwarden.operator.fairness_render import PolicyChoice, choose_policy
from fleetwarden.operator.fleet import (
    FleetView,
    ObjectRecord,
    PoolUsers,
    demands_of,
    forget_parsed,
    parse_model_deployment,
    retain_parsed,
)
from fleetwarden.operator.kube import MODEL_DEPLOYMENTS, REGION_POOLS, TENANT_POLICIES, ResourceKind
from fleetwarden.operator.pool_index import DegradedUsers
from fleetwarden.operator.reconcilers.context import Context
from fleetwarden.operator.reconcilers.modeldeployment import reconcile_model_deployment
from fleetwarden.operator.reconcilers.regionpool import reconcile_region_pool
from fleetwarden.operator.reconcilers.tenantpolicy import reconcile_tenant_policy
from fleetwarden.operator.served_names import ServedNameIndex

logger = logging.getLogger(__name__)

POOLS_INDEX = "fleet_regionpools"
MODEL_DEPLOYMENTS_INDEX = "fleet_modeldeployments"
TENANT_POLICIES_INDEX = "fleet_tenantpolicies"
POOL_USERS_INDEX = "fleet_pool_users"
"""ModelDeployment keys by the pools their spec names (`pool_index.pool_user_entries`)."""
INDEX_NAMES = (POOLS_INDEX, MODEL_DEPLOYMENTS_INDEX, TENANT_POLICIES_INDEX, POOL_USERS_INDEX)

RETRY_INITIAL_S = 1.0
RETRY_MAX_S = 60.0


class Coalescer:
    """At most one run per key at a time; requests during a run cause exactly one more run."""

    def __init__(
        self,
        name: str,
        run: Callable[[str], Awaitable[None]],
        context: Callable[[], contextvars.Context | None] = lambda: None,
    ) -> None:
        self._name = name
        self._run = run
        self._context = context
        self._running: set[str] = set()
        self._dirty: set[str] = set()
        self._failures: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def request(self, key: str) -> None:
        """Ask for a run of `key` soon; never blocks the caller (a Kopf handler)."""
        if key in self._running:
            self._dirty.add(key)
            return
        self._running.add(key)
        # Runs happen in a Kopf handler's context even when a background task (the resync, the
        # metrics poller) asked for them: Kopf's Event posting lives in context variables.
        task = asyncio.get_running_loop().create_task(
            self._drain(key), name=f"{self._name}:{key}", context=self._context()
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self, key: str) -> None:
        try:
            while True:
                self._dirty.discard(key)
                try:
                    await self._run(key)
                    self._failures.pop(key, None)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    failures = self._failures[key] = self._failures.get(key, 0) + 1
                    delay = min(RETRY_MAX_S, RETRY_INITIAL_S * 2 ** (failures - 1))
                    logger.exception("%s %s failed; retrying in %.0f s", self._name, key, delay)
                    asyncio.get_running_loop().call_later(delay, self.request, key)
                if key not in self._dirty:
                    return
        finally:
            self._running.discard(key)

    async def idle(self) -> None:
        """Wait until no run is in progress (tests and the demo use it)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    async def stop(self) -> None:
        """Cancel every run and wait until they have unwound (before the API client closes)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(frozen=True)
class Footprint:
    """What a ModelDeployment's dependents read of it, as they last saw it (see `_fan_out`)."""

    selection: tuple[object, ...]
    """Its spec (by generation), its labels (policy selectors) and the pools named in its
    status: what its TenantPolicies and served-name rivals depend on, and which pools it touches."""
    demands: tuple[tuple[str, int, int], ...]
    """(pool, instances, GPUs per instance) as pool accounting counts them (`demands_of`): the
    replicas a scaling step or a plan writes into status move these without a new generation."""


def footprint(record: ObjectRecord) -> Footprint:
    """`record`'s footprint; the demands come from the very function the accounting calls, so
    a status write that moves only `ready` or the conditions leaves it equal (no fan-out)."""
    pools = tuple(sorted(str(r.get("pool")) for r in record.status.get("regions") or []))
    demands = sorted((d.pool, d.instances, d.gpus_per_instance) for d in demands_of(record))
    return Footprint(
        (record.generation, tuple(sorted(record.labels.items())), pools), tuple(demands)
    )


def accounting_changes(before: Footprint, after: Footprint) -> list[str]:
    """The pools whose accounting of this ModelDeployment differs between two footprints."""
    return sorted({pool for pool, _, _ in set(before.demands) ^ set(after.demands)})


def _records(index: Mapping[Any, Any] | None) -> list[ObjectRecord]:
    if index is None:
        return []
    records = []
    for store in index.values():
        for record in store:
            if isinstance(record, ObjectRecord):
                records.append(record)
    return records


def rivals(
    view: FleetView,
    record: ObjectRecord,
    pools: Iterable[str],
    serving: Collection[str],
    degraded_users: DegradedUsers | None = None,
) -> set[str]:
    """ModelDeployments younger than `record` that are in `serving` (they share a served name
    with it, now or before a rename), or use one of `pools` while Degraded (a shortfall the
    change may clear): the ones whose conflict conditions a change of `record` may end.

    Pool sharers that report no problem are left to the resync: a large pool is shared by
    hundreds, and waking every younger one on each spec edit would make a fleet-wide update
    quadratic in reconciles.

    The Degraded pool users come from `degraded_users` (the runtime's, kept between calls:
    scanning the fleet per pool on every scaling step cost tens of ms), or from a fresh index
    (hand-made views in tests, one-off callers: linear in the fleet).
    """
    keys = set(serving)
    keys |= (degraded_users if degraded_users is not None else DegradedUsers()).using(view, pools)
    order = (record.created, record.key)
    return {
        key
        for key in keys
        if key != record.key
        and (other := view.model_deployments.get(key)) is not None
        and (other.created, key) > order
    }


@dataclass
class Runtime:
    """Shared by every handler through Kopf's `memo`; one per operator process."""

    context: Context
    indices: Mapping[str, Mapping[Any, Any]] = field(default_factory=dict)
    """Kopf's live indices, bound on the first handler call (they are live views)."""
    seen_generations: dict[str, int | None] = field(default_factory=dict)
    footprints: dict[str, Footprint] = field(default_factory=dict)
    """What each ModelDeployment's dependents last saw of it (see `_fan_out`)."""
    kopf_context: contextvars.Context | None = None
    accounting: AccountingCache = field(default_factory=AccountingCache)
    """The fleet's pool accounting, kept until a pool or a ModelDeployment's demands change
    (`accounting_cache`); owned here so that two operators in one process never share it."""
    served_names: ServedNameIndex = field(default_factory=ServedNameIndex)
    """The fleet's ModelDeployments by served name, for the conflict check (`served_names`)."""
    served_as: dict[str, str] = field(default_factory=dict)
    """Each ModelDeployment's served name at its last fan-out, so a rename wakes its old rivals."""
    degraded_users: DegradedUsers = field(default_factory=DegradedUsers)
    """The fleet's Degraded ModelDeployments by pool, for `rivals` (`pool_index`)."""
    policy_of: dict[str, str | None] = field(default_factory=dict)
    """Each ModelDeployment's winning TenantPolicy (key) as of its last reconcile: the one
    policy whose pod counts its pods' changes move (`_acknowledgements_changed`)."""
    model_deployments: Coalescer = field(init=False)
    pools: Coalescer = field(init=False)
    policies: Coalescer = field(init=False)

    def __post_init__(self) -> None:
        context = self._handler_context
        self.model_deployments = Coalescer(
            "modeldeployment", self._reconcile_model_deployment, context
        )
        self.pools = Coalescer("regionpool", self._reconcile_pool, context)
        self.policies = Coalescer("tenantpolicy", self._reconcile_policy, context)
        self.context.pusher.on_change = self._acknowledgements_changed

    def _acknowledgements_changed(self, model_deployment: str) -> None:
        """Pods acknowledged a config (or came and went): the TenantPolicy that counts them.

        Only the winning policy sums a ModelDeployment's pods (`tenantpolicy._selection`); asking
        every policy of the namespace made a 1,000-pod rollout 800,000 requests at 200 policies,
        and building a view per callback cost more than the request. A ModelDeployment whose
        winner changes tells both policies when it reconciles (`_note_policy`).
        """
        policy = self.policy_of.get(model_deployment)
        if policy is not None:
            self.policies.request(policy)

    def _note_policy(self, view: FleetView, record: ObjectRecord) -> PolicyChoice:
        """Keep which TenantPolicy wins `record` (as its reconcile and `_selection` judge it);
        when that changes, both the policy that lost it and the one that won it recount.

        Returns the choice, which the reconcile then uses as it is: resolving it again from the
        same view matched every policy's selector a second time for the same answer.
        """
        choice = choose_policy(view.policy_refs(record.namespace, record.labels))
        winner = None if choice.winner is None else f"{record.namespace}/{choice.winner.name}"
        known = record.key in self.policy_of
        before = self.policy_of.get(record.key)
        self.policy_of[record.key] = winner
        if not known or before != winner:
            for policy in sorted({p for p in (before, winner) if p is not None}):
                self.policies.request(policy)
        return choice

    def bind(self, kwargs: Mapping[str, Any]) -> None:
        """Keep Kopf's index objects, which handlers receive as keyword arguments, and a copy of
        a handler's context for runs that background tasks request."""
        if not self.indices:
            self.indices = {name: kwargs[name] for name in INDEX_NAMES if name in kwargs}
        if self.kopf_context is None:
            self.kopf_context = contextvars.copy_context()

    def _handler_context(self) -> contextvars.Context | None:
        return self.kopf_context

    def view(self) -> FleetView:
        return FleetView.of(
            pools=_records(self.indices.get(POOLS_INDEX)),
            model_deployments=_records(self.indices.get(MODEL_DEPLOYMENTS_INDEX)),
            tenant_policies=_records(self.indices.get(TENANT_POLICIES_INDEX)),
            pool_users=self._pool_users(),
        )

    def _pool_users(self) -> PoolUsers | None:
        """A pool's users as Kopf's pool-users index lists them when asked (None without it:
        the view then scans). Each answer is a copy: the index's stores are live."""
        index = self.indices.get(POOL_USERS_INDEX)
        if index is None:
            return None

        def users(pool: str) -> tuple[str, ...]:
            return tuple(index.get(pool) or ())

        return users

    def pool_users(self, pool: str) -> list[str]:
        """Keys of the ModelDeployments whose spec names `pool`, sorted: the keys of
        `view().model_deployments_using(pool)`, without building a view of the whole fleet.

        What the RegionPool handler wakes on a spec change: with the indices bound it reads the
        pool's users and their records only, O(the pool's users) instead of O(the fleet) twice.
        """
        index = self.indices.get(POOL_USERS_INDEX)
        records = self.indices.get(MODEL_DEPLOYMENTS_INDEX)
        if index is None or records is None:
            return [record.key for record in self.view().model_deployments_using(pool)]
        users = {key: records[key] for key in set(index.get(pool) or ()) if key in records}
        view = FleetView.of(model_deployments=_records(users))  # the users only: no index
        return [record.key for record in view.model_deployments_using(pool)]

    async def fresh_view(self, kind: ResourceKind, key: str) -> FleetView | None:
        """The snapshot, with the object to reconcile re-read from the API server.

        Kopf's indices follow watch streams, so a reconcile that runs right after another may see
        the object without the status the first one just wrote, and repeat its Events. Reading the
        object itself fresh costs one GET and makes every reconcile see its own last write.
        None when the object is gone.
        """
        namespace, _, name = key.rpartition("/")
        body = await self.context.kube.get(kind, name, namespace or None)
        if body is None:
            return None
        return self.view().with_fresh(ObjectRecord.from_body(body))

    def generation_changed(self, kind: str, record: ObjectRecord) -> bool:
        """Whether this object's spec changed since the last event seen for it."""
        key = f"{kind}:{record.key}"
        changed = self.seen_generations.get(key, -1) != record.generation
        self.seen_generations[key] = record.generation
        return changed

    def forget(self, kind: str, record: ObjectRecord) -> None:
        """A RegionPool or TenantPolicy was deleted: drop what is kept about it."""
        self.seen_generations.pop(f"{kind}:{record.key}", None)
        forget_parsed(record)

    async def _reconcile_model_deployment(self, key: str) -> None:
        view = await self.fresh_view(MODEL_DEPLOYMENTS, key)
        if view is None:
            return
        record = view.model_deployments[key]
        # Before the reconcile: the pods it syncs report to the winner it resolves, which is
        # this very choice (resolved once, from the same view and record).
        choice = self._note_policy(view, record)
        await reconcile_model_deployment(
            self.context, view, key, self.accounting, self.served_names, choice
        )
        # The record as read before this pass: replicas it writes come back as an event, and
        # the pass that event asks for sees them here.
        after = footprint(record)
        before = self.footprints.get(key)
        if before == after:
            return
        self.footprints[key] = after
        if before is None or before.selection != after.selection:
            self._forget_removed_regions(record)
            self._fan_out(record, wake_rivals=before is not None)
        else:
            self._accounting_changed(record, accounting_changes(before, after))

    def model_deployment_gone(self, record: ObjectRecord) -> None:
        """A ModelDeployment was deleted: its pools and policies must stop counting it."""
        self.footprints.pop(record.key, None)
        self._fan_out(record, wake_rivals=True)
        forget_parsed(record)
        self._forget_model_deployment(record.key)

    def _forget_model_deployment(self, key: str) -> None:
        """Drop all the runtime keeps about a ModelDeployment that is gone (served-name and
        pool indices and the accounting drop theirs on their next refresh)."""
        self.footprints.pop(key, None)
        self.served_as.pop(key, None)
        self.context.pusher.forget_model_deployment(key)
        self.policy_of.pop(key, None)  # after the pusher: its last pod changes reach the winner
        if self.context.autoscaler is not None:
            self.context.autoscaler.forget(key)
        if self.context.plans is not None:
            self.context.plans.forget(key)

    def _forget_removed_regions(self, record: ObjectRecord) -> None:
        """Drop the scaling state and plan records of pools a new spec no longer names.

        Called when the footprint's selection changed (a new generation: the only way regions
        go), not on every reconcile: each call looks through every region's entries. An invalid
        spec forgets nothing: its children keep running until it is fixed.
        """
        spec = parse_model_deployment(record).spec
        if spec is None:
            return
        pools = {placement.pool for placement in spec.regions}
        if self.context.autoscaler is not None:
            self.context.autoscaler.forget_regions(record.key, pools)
        if self.context.plans is not None:
            self.context.plans.forget_regions(record.key, pools)

    def _fan_out(self, record: ObjectRecord, wake_rivals: bool) -> None:
        """Re-reconcile what depends on a ModelDeployment: the pools it uses or used (their
        allocation), its namespace's TenantPolicies (what they select) and, with `wake_rivals`,
        the younger ModelDeployments sharing its served name (or the one it had), or a pool
        while Degraded (`rivals`).

        Only when its footprint's selection changed (a change of its accounted replicas alone
        goes to `_accounting_changed`): most reconciles are woken by a child's status update,
        and fanning out on each of those would re-read every pool and policy for nothing.
        Rivals only when it changed or went away, not when first seen (a new ModelDeployment
        cannot clear a rival's conflict, so the operator's start costs no second pass), and only
        younger ones: conflicts and shortfalls fall on the later-created, so an older rival's
        status cannot depend on this one. Without this a rival kept a stale ServedNameConflict or
        InsufficientPoolCapacity until the next resync.
        """
        regions = [*(record.spec.get("regions") or []), *(record.status.get("regions") or [])]
        pools = sorted(
            p
            for p in {r.get("pool") for r in regions if isinstance(r, Mapping)}
            if isinstance(p, str)
        )
        for pool in pools:
            self.pools.request(pool)
        view = self.view()
        for policy in view.tenant_policies.values():
            if policy.namespace == record.namespace:
                self.policies.request(policy.key)
        spec = parse_model_deployment(record).spec
        names = {self.served_as.pop(record.key, None)}
        if spec is not None:
            names.add(spec.served_name)
            self.served_as[record.key] = spec.served_name
        if wake_rivals:
            serving = {
                k for name in names if name is not None for k in self.served_names.serving(name)
            }
            for key in sorted(rivals(view, record, pools, serving, self.degraded_users)):
                self.model_deployments.request(key)

    def _accounting_changed(self, record: ObjectRecord, pools: list[str]) -> None:
        """Only what pool accounting reads of a ModelDeployment moved (a scaling step or a plan
        wrote other replicas into its status): re-reconcile the pools whose allocation changed,
        and the younger ModelDeployments using them while Degraded (`rivals`), whose shortfall
        the GPUs it freed may end, or whose shortfall message it changed.

        Not its TenantPolicies nor its served-name rivals: they read its spec and labels, not its
        replicas, and scaling steps are frequent. Healthy pool sharers wait for the resync, as in
        `_fan_out`: a fleet-wide scaling round must not wake every sharer once per older one.
        """
        for pool in pools:
            self.pools.request(pool)
        for key in sorted(rivals(self.view(), record, pools, (), self.degraded_users)):
            self.model_deployments.request(key)

    async def _reconcile_pool(self, name: str) -> None:
        view = await self.fresh_view(REGION_POOLS, name)
        if view is not None:
            await reconcile_region_pool(self.context, view, name, self.accounting)

    async def _reconcile_policy(self, key: str) -> None:
        view = await self.fresh_view(TENANT_POLICIES, key)
        if view is not None:
            await reconcile_tenant_policy(self.context, view, key)

    def request_all(self) -> None:
        """Ask for a reconcile of every object in the snapshot (the periodic resync), after
        dropping kept parses of objects no longer in it, and all kept about ModelDeployments
        no longer in it (deletions whose event was missed)."""
        view = self.view()
        retain_parsed(view)
        for key in sorted(self._known_model_deployments() - view.model_deployments.keys()):
            self._forget_model_deployment(key)
        for key in sorted(view.model_deployments):
            self.model_deployments.request(key)
        for key in sorted(view.pools):
            self.pools.request(key)
        for key in sorted(view.tenant_policies):
            self.policies.request(key)

    def _known_model_deployments(self) -> set[str]:
        """Every ModelDeployment key something in this process keeps state for."""
        known = {*self.footprints, *self.served_as, *self.policy_of}
        pusher = self.context.pusher
        known.update(pusher.desired)
        known.update(pod.model_deployment for pod in pusher.pods.values())
        scaler = self.context.autoscaler
        if scaler is not None:
            known.update(key[0] for store in (scaler.signals, scaler.plans) for key in store)
            known.update(scaler.missing, scaler.missing_load)
        if self.context.plans is not None:
            known.update(key[0] for key in self.context.plans.endpoints)
            known.update(self.context.plans.health)
        return known

    async def resync_forever(self, interval_s: float) -> None:
        """Reconcile everything every `interval_s`: the backstop for anything events missed.

        One loop in the operator rather than a Kopf timer per object: Kopf puts a finalizer on
        every object with a timer, which would write to users' objects and block their deletion
        whenever the operator is not running.
        """
        while True:
            await asyncio.sleep(interval_s)
            self.request_all()

    async def idle(self) -> None:
        """Wait until every requested reconcile has finished (including ones they requested)."""
        for _ in range(10):
            await self.model_deployments.idle()
            await self.pools.idle()
            await self.policies.idle()
            if not (self.model_deployments.busy or self.pools.busy or self.policies.busy):
                return

    async def stop(self) -> None:
        for coalescer in (self.model_deployments, self.pools, self.policies):
            await coalescer.stop()
        await self.context.pusher.close()
