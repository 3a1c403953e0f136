"""Pool accounting: how many instances and GPUs each ModelDeployment takes from each RegionPool.

Pure. When a pool is overcommitted, the ModelDeployments that arrived last (creation time, then
namespace/name) are the ones told so: earlier ones were placed while there was room, and blaming
everybody would tell no one what to fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from fleetwarden.api.v1alpha1 import RegionPoolSpec


@dataclass(frozen=True)
class Demand:
    """Instances one ModelDeployment asks of one pool."""

    model_deployment: str
    """namespace/name."""
    created: str
    """creationTimestamp, for first-come ordering."""
    pool: str
    instances: int
    gpus_per_instance: int

    @property
    def gpus(self) -> int:
        return self.instances * self.gpus_per_instance


@dataclass(frozen=True)
class Shortfall:
    """A demand that does not fit in its pool."""

    model_deployment: str
    pool: str
    message: str


@dataclass
class PoolUsage:
    """What a pool holds after placing every demand on it."""

    pool: str
    allocations: dict[str, tuple[int, int]] = field(default_factory=dict)
    """model deployment -> (instances, gpus)."""
    instances: int = 0
    gpus: int = 0
    free_instances: int | None = None
    free_gpus: int | None = None

    @property
    def overcommitted(self) -> bool:
        return (self.free_instances is not None and self.free_instances < 0) or (
            self.free_gpus is not None and self.free_gpus < 0
        )


@dataclass(frozen=True)
class Accounting:
    usage: dict[str, PoolUsage]
    shortfalls: tuple[Shortfall, ...]

    def shortfalls_of(self, model_deployment: str) -> list[Shortfall]:
        """This ModelDeployment's shortfalls, in `shortfalls` order."""
        return list(self._shortfalls_by_model_deployment.get(model_deployment, ()))

    @cached_property
    def _shortfalls_by_model_deployment(self) -> dict[str, list[Shortfall]]:
        """`shortfalls` grouped once: one accounting is shared by every reconcile of an unchanged
        fleet (`accounting_cache`), and scanning thousands of shortfalls per call added up.
        Private and never handed out (`shortfalls_of` copies), so it stays as built."""
        grouped: dict[str, list[Shortfall]] = {}
        for shortfall in self.shortfalls:
            if shortfall.model_deployment in grouped:
                grouped[shortfall.model_deployment].append(shortfall)
            else:
                grouped[shortfall.model_deployment] = [shortfall]
        return grouped


def account(pools: Mapping[str, RegionPoolSpec], demands: Sequence[Demand]) -> Accounting:
    """Place `demands` on `pools` in arrival order and report usage and what does not fit."""
    usage = {name: PoolUsage(pool=name) for name in pools}
    shortfalls: list[Shortfall] = []
    for demand in sorted(demands, key=lambda d: (d.created, d.model_deployment, d.pool)):
        spec = pools.get(demand.pool)
        if spec is None:
            continue  # a missing pool is reported by the ModelDeployment's own check
        pool = usage[demand.pool]
        before_instances, before_gpus = pool.allocations.get(demand.model_deployment, (0, 0))
        pool.allocations[demand.model_deployment] = (
            before_instances + demand.instances,
            before_gpus + demand.gpus,
        )
        pool.instances += demand.instances
        pool.gpus += demand.gpus
        problems = []
        if spec.capacity.instances is not None and pool.instances > spec.capacity.instances:
            problems.append(
                f"{pool.instances} instances placed, capacity {spec.capacity.instances}"
            )
        if spec.capacity.gpus is not None and pool.gpus > spec.capacity.gpus:
            problems.append(f"{pool.gpus} GPUs placed, capacity {spec.capacity.gpus}")
        if problems and demand.instances > 0:
            shortfalls.append(
                Shortfall(
                    model_deployment=demand.model_deployment,
                    pool=demand.pool,
                    message=(
                        f"pool {demand.pool} cannot hold {demand.instances} more instances "
                        f"({demand.gpus} GPUs): {'; '.join(problems)}"
                    ),
                )
            )
    for name, spec in pools.items():
        pool = usage[name]
        if spec.capacity.instances is not None:
            pool.free_instances = spec.capacity.instances - pool.instances
        if spec.capacity.gpus is not None:
            pool.free_gpus = spec.capacity.gpus - pool.gpus
    return Accounting(usage=usage, shortfalls=tuple(shortfalls))
