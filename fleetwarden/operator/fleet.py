"""A snapshot of every fleetwarden object the operator sees, and the facts derived from it.

Reconciling one object needs the others (a ModelDeployment needs its pools and the TenantPolicies
that select it; a pool's status sums every ModelDeployment using it). Kopf's indices hold the live
objects; a `FleetView` is a plain, immutable copy of them, so the reconcilers stay testable with
hand-made views and never see an object change halfway through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from fleetwarden.api.v1alpha1 import (
    LabelSelector,
    ModelDeploymentSpec,
    RegionPlacement,
    RegionPoolSpec,
    TenantPolicySpec,
)
from fleetwarden.operator.allocation import Demand
from fleetwarden.operator.fairness_render import PolicyRef
from fleetwarden.operator.spec_cache import SpecCache

JsonDict = dict[str, Any]
SpecT = TypeVar("SpecT", RegionPoolSpec, ModelDeploymentSpec, TenantPolicySpec)

PoolUsers = Callable[[str], Iterable[str]]
"""Pool name -> keys of the ModelDeployments whose spec names it, as an index keeps them
(`FleetView.pool_users`). It may list keys a view does not hold, or whose record in the view no
longer names the pool: `FleetView.model_deployments_using` checks each against the view."""


def object_key(namespace: str | None, name: str) -> str:
    """`namespace/name`, or just `name` for cluster-scoped objects: how the fleet keys objects
    (`ObjectRecord.key`), shared with the indices that key by it without building a record."""
    return f"{namespace}/{name}" if namespace else name


def pools_named_in(spec: Any) -> frozenset[str]:
    """The pools a raw ModelDeployment spec's `regions` names (the raw spec, so an invalid spec
    still counts for the pools it names). Never raises, whatever `spec` holds: the pool-users
    index runs it on every event, and an index function that fails drops the object from that
    index only, where it would then be missing while the fleet's records still hold it."""
    regions = spec.get("regions") if isinstance(spec, Mapping) else None
    if not isinstance(regions, (list, tuple)):
        return frozenset()
    return frozenset(
        pool
        for region in regions
        if isinstance(region, Mapping) and isinstance(pool := region.get("pool"), str)
    )


@dataclass(frozen=True)
class ObjectRecord:
    """The parts of a custom resource the reconcilers read."""

    name: str
    namespace: str | None
    uid: str
    generation: int | None
    created: str
    labels: Mapping[str, str]
    spec: JsonDict
    status: JsonDict
    api_version: str
    kind: str

    @cached_property
    def key(self) -> str:
        """`namespace/name`, or just `name` for cluster-scoped objects.

        Kept after the first read (the record is frozen, so it cannot go stale): every reconcile
        builds a view keyed by it over the whole fleet, and formatting it each time was about
        half the cost of building the view.
        """
        return object_key(self.namespace, self.name)

    @property
    def reference(self) -> JsonDict:
        """A minimal body that Kopf can attach Events to."""
        metadata: JsonDict = {"name": self.name, "uid": self.uid}
        if self.namespace:
            metadata["namespace"] = self.namespace
        return {"apiVersion": self.api_version, "kind": self.kind, "metadata": metadata}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ObjectRecord:
        """Copy out of a Kopf body (or any API dict); deep-copied so later events cannot mutate it."""
        metadata = body.get("metadata", {})
        return cls(
            name=str(metadata.get("name", "")),
            namespace=metadata.get("namespace"),
            uid=str(metadata.get("uid", "")),
            generation=metadata.get("generation"),
            created=str(metadata.get("creationTimestamp", "")),
            labels=dict(metadata.get("labels") or {}),
            spec=_plain(body.get("spec") or {}),
            status=_plain(body.get("status") or {}),
            api_version=str(body.get("apiVersion", "")),
            kind=str(body.get("kind", "")),
        )


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class Parsed(Generic[SpecT]):
    """A spec parsed into its model, or the validation error that explains why it is not."""

    spec: SpecT | None
    error: str | None


def _parse(model: type[SpecT], raw: Mapping[str, Any]) -> Parsed[SpecT]:
    try:
        return Parsed(spec=model.model_validate(raw), error=None)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg']}"
            for err in exc.errors()
        )
        return Parsed(spec=None, error=f"invalid spec: {problems}")


MAX_CACHED_SPECS = 8192
"""Slots per kind (`spec_cache`). A parsed ModelDeployment spec takes about 10 KB, so the cap
costs at most about 80 MB, and only with that many live objects; past it lookups miss more."""

MODEL_DEPLOYMENT_SPECS: SpecCache[Parsed[ModelDeploymentSpec]] = SpecCache(MAX_CACHED_SPECS)
POOL_SPECS: SpecCache[Parsed[RegionPoolSpec]] = SpecCache(MAX_CACHED_SPECS)
TENANT_POLICY_SPECS: SpecCache[Parsed[TenantPolicySpec]] = SpecCache(MAX_CACHED_SPECS)
_CACHES: dict[str, SpecCache[Any]] = {
    "RegionPool": POOL_SPECS,
    "ModelDeployment": MODEL_DEPLOYMENT_SPECS,
    "TenantPolicy": TENANT_POLICY_SPECS,
}


# The cached parsers name `_parse` at call time (not a partial bound at import) so that tests can
# count real parses by wrapping it.
def _parse_pool_spec(raw: Mapping[str, Any]) -> Parsed[RegionPoolSpec]:
    return _parse(RegionPoolSpec, raw)


def _parse_model_deployment_spec(raw: Mapping[str, Any]) -> Parsed[ModelDeploymentSpec]:
    return _parse(ModelDeploymentSpec, raw)


def _parse_tenant_policy_spec(raw: Mapping[str, Any]) -> Parsed[TenantPolicySpec]:
    return _parse(TenantPolicySpec, raw)


def parse_pool(record: ObjectRecord) -> Parsed[RegionPoolSpec]:
    """The pool's spec parsed; validated once per spec (`spec_cache`), not once per call."""
    return POOL_SPECS.get(record, _parse_pool_spec)


def parse_model_deployment(record: ObjectRecord) -> Parsed[ModelDeploymentSpec]:
    """The ModelDeployment's spec parsed; validated once per spec (`spec_cache`), not per call:
    every reconcile reads every ModelDeployment's spec for pool accounting."""
    return MODEL_DEPLOYMENT_SPECS.get(record, _parse_model_deployment_spec)


def parse_tenant_policy(record: ObjectRecord) -> Parsed[TenantPolicySpec]:
    """The policy's spec parsed; validated once per spec (`spec_cache`), not once per call."""
    return TENANT_POLICY_SPECS.get(record, _parse_tenant_policy_spec)


def forget_parsed(record: ObjectRecord) -> None:
    """Drop the kept parse of a deleted object (a no-op for kinds that are not cached)."""
    cache = _CACHES.get(record.kind)
    if cache is not None:
        cache.forget(record.namespace, record.name)


def retain_parsed(view: FleetView) -> None:
    """Drop the kept parses of objects `view` does not hold: deletions whose event was missed."""
    for cache, records in (
        (POOL_SPECS, view.pools),
        (MODEL_DEPLOYMENT_SPECS, view.model_deployments),
        (TENANT_POLICY_SPECS, view.tenant_policies),
    ):
        cache.retain((r.namespace, r.name) for r in records.values())


def planned_replicas(record: ObjectRecord, placement: RegionPlacement) -> int:
    """Replicas the operator asks for in one region: its last decision, kept within [min, max].

    Until a plan or the scaler moves it, that is `minInstances`. Reading the decision back from
    status (not from the Deployment) is what makes manual edits of replicas drift to be corrected.
    """
    previous = placement.min_instances
    for region in record.status.get("regions") or []:
        if region.get("pool") == placement.pool and isinstance(region.get("current"), int):
            previous = region["current"]
    return max(placement.min_instances, min(placement.max_instances, previous))


def starting_replicas(record: ObjectRecord, placement: RegionPlacement, replicas: int) -> int:
    """How many of `replicas` in one region are not ready yet, as the last status saw them.

    The scaler counts them as capacity already bought (`ScalingSignal.starting`). A region the
    status has not reported on yet counts none as starting, which scales as before.
    """
    for region in record.status.get("regions") or []:
        if region.get("pool") == placement.pool and isinstance(region.get("ready"), int):
            ready: int = region["ready"]
            return max(0, min(replicas, replicas - ready))
    return 0


def demands_of(record: ObjectRecord) -> tuple[Demand, ...]:
    """What one ModelDeployment asks of each pool it names, or holds while its spec is invalid.

    One record's share of `FleetView.demands`, separate so that `accounting_cache` can derive it
    per record, and only for records that changed. It reads the record's key, creationTimestamp,
    spec and `status.regions[].pool/current` (via `planned_replicas`), nothing else, so it stays
    a pure function of the record (what the cache's exactness rests on).
    """
    spec = parse_model_deployment(record).spec
    if spec is None:
        return _running_demands(record)
    key, created, gpus_per_instance = record.key, record.created, spec.model.gpus_per_instance
    return tuple(
        Demand(
            model_deployment=key,
            created=created,
            pool=placement.pool,
            instances=planned_replicas(record, placement),
            gpus_per_instance=gpus_per_instance,
        )
        for placement in spec.regions
    )


def named_pools(record: ObjectRecord) -> frozenset[str]:
    """The pools `record`'s raw `spec.regions` names: what `model_deployments_using` matches."""
    return pools_named_in(record.spec)


def _raw_selector_matches(raw_spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether an invalid TenantPolicy still selects `labels`, judged by its raw selector.

    Why: an invalid edit elsewhere in the spec (a bad quantum, say) must not make the policy
    select nothing, or every ModelDeployment it configured would fall back to the default config
    (see `fairness_render.choose_policy`). The selector is read on its own; when the selector
    itself does not parse either, the policy counts as selecting everything in its namespace:
    holding a config back and reporting the broken policy is safer than switching live sidecars.
    """
    try:
        selector = LabelSelector.model_validate(raw_spec.get("selector") or {})
    except ValidationError:
        return True
    return selector.matches(dict(labels))


def _running_demands(record: ObjectRecord) -> tuple[Demand, ...]:
    """What a ModelDeployment with an invalid spec still holds: the replicas its status says run.

    Why: an invalid spec leaves its children running (the reconciler touches nothing), so
    freeing their GPUs would let other ModelDeployments be placed on GPUs still in use. Regions
    and replicas come from `status.regions[]` (what the last valid reconcile asked for); GPUs
    per instance from the raw `spec.model.gpusPerInstance`, which the CRD schema keeps an integer
    in [1, 64] even when the spec fails the model's own checks (status does not carry it). If
    that field is unreadable too, 1 GPU per instance (the CRD default) is counted: an estimate.
    """
    model = record.spec.get("model")
    raw = model.get("gpusPerInstance") if isinstance(model, Mapping) else None
    gpus = raw if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 1 else 1
    return tuple(
        Demand(
            model_deployment=record.key,
            created=record.created,
            pool=region["pool"],
            instances=region["current"],
            gpus_per_instance=gpus,
        )
        for region in record.status.get("regions") or []
        if isinstance(region, Mapping)
        and isinstance(region.get("pool"), str)
        and isinstance(region.get("current"), int)
        and region["current"] > 0
    )


@dataclass(frozen=True)
class _WithFreshUser:
    """`base`, with `key` added under the pools its fresh record names (`FleetView.with_fresh`):
    an index that follows watch events may not have seen the record a GET just returned."""

    base: PoolUsers
    key: str
    pools: frozenset[str]

    def __call__(self, pool: str) -> Iterable[str]:
        users = self.base(pool)
        return (*users, self.key) if pool in self.pools else users


@dataclass(frozen=True)
class FleetView:
    """Every RegionPool, ModelDeployment and TenantPolicy, keyed by `ObjectRecord.key`."""

    pools: Mapping[str, ObjectRecord] = field(default_factory=dict)
    model_deployments: Mapping[str, ObjectRecord] = field(default_factory=dict)
    tenant_policies: Mapping[str, ObjectRecord] = field(default_factory=dict)
    pool_users: PoolUsers | None = field(default=None, compare=False)
    """Which ModelDeployments name each pool, from the operator's index (`Runtime.view`), so that
    `model_deployments_using` reads a pool's users instead of every ModelDeployment; None (views
    made by hand, one-off readers) scans the view."""

    @classmethod
    def of(
        cls,
        pools: Iterable[ObjectRecord] = (),
        model_deployments: Iterable[ObjectRecord] = (),
        tenant_policies: Iterable[ObjectRecord] = (),
        pool_users: PoolUsers | None = None,
    ) -> FleetView:
        return cls(
            pools={r.key: r for r in pools},
            model_deployments={r.key: r for r in model_deployments},
            tenant_policies={r.key: r for r in tenant_policies},
            pool_users=pool_users,
        )

    def with_fresh(self, record: ObjectRecord) -> FleetView:
        """This view with one object replaced by a fresher copy (read-your-writes)."""
        table = {
            "RegionPool": "pools",
            "ModelDeployment": "model_deployments",
            "TenantPolicy": "tenant_policies",
        }[record.kind]
        updated = dict(getattr(self, table))
        updated[record.key] = record
        users = self.pool_users
        if table == "model_deployments" and users is not None:
            users = _WithFreshUser(users, record.key, named_pools(record))
        return replace(self, **{table: updated}, pool_users=users)

    def valid_pools(self) -> dict[str, RegionPoolSpec]:
        """Pools whose spec parses; invalid ones hold nothing."""
        result = {}
        for name, record in self.pools.items():
            parsed = parse_pool(record)
            if parsed.spec is not None:
                result[name] = parsed.spec
        return result

    def demands(self) -> list[Demand]:
        """What every ModelDeployment asks of (or, while invalid, holds in) every pool."""
        return [d for record in self.model_deployments.values() for d in demands_of(record)]

    def policy_refs(self, namespace: str | None, labels: Mapping[str, str]) -> list[PolicyRef]:
        """The TenantPolicies of `namespace`, each saying whether it selects `labels`."""
        refs = []
        for record in self.tenant_policies.values():
            if record.namespace != namespace:
                continue
            parsed = parse_tenant_policy(record)
            if parsed.spec is not None:
                selected = parsed.spec.selector.matches(dict(labels))
            else:
                selected = _raw_selector_matches(record.spec, labels)
            refs.append(
                PolicyRef(
                    namespace=record.namespace or "",
                    name=record.name,
                    created=record.created,
                    labels_selected=selected,
                    spec=parsed.spec,
                    error=parsed.error,
                )
            )
        return refs

    def model_deployments_in(self, namespace: str | None) -> list[ObjectRecord]:
        return sorted(
            (r for r in self.model_deployments.values() if r.namespace == namespace),
            key=lambda r: r.key,
        )

    def model_deployments_using(self, pool: str) -> list[ObjectRecord]:
        """The ModelDeployments of this view whose raw spec names `pool`, sorted by key.

        With `pool_users` only the keys it lists for `pool` are read (O(the pool's users), not
        O(the fleet): the RegionPool handler and spot sharing ask per event and per region),
        each checked against its record here, so the answer is the scan's for any index that
        lists at least the pool's users. Read after the index moved on (a reconcile's awaits),
        a ModelDeployment that has since left the pool or gone is not listed any more.
        """
        if self.pool_users is None:
            candidates: Iterable[ObjectRecord] = self.model_deployments.values()
        else:
            records = self.model_deployments
            candidates = [
                record
                for key in set(self.pool_users(pool))
                if (record := records.get(key)) is not None
            ]
        return sorted((r for r in candidates if pool in named_pools(r)), key=lambda r: r.key)
