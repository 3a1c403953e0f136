"""What the `static` strategy can pin: every endpoint at `maxInstances`, as far as its pool holds.

`static` answers "what does not autoscaling cost": every endpoint runs its `maxInstances` all the
time. On a pool whose capacity is smaller than the sum of its endpoints' `maxInstances`, those
instances do not exist in production (the extra pods stay Pending), so billing them would
overstate the cost and the served capacity. The placement follows the operator's pool
accounting (operator/allocation.py `account`): demands are placed in ModelDeployment creation
order (creationTimestamp, then namespace/name, then pool), each instance taking
`gpusPerInstance` GPUs and one of `capacity.instances`; a ModelDeployment placed later gets
what is left. Unlike the operator, which only reports an overcommitted pool, the simulator
clamps to what fits and returns one note per clamped endpoint for the run's output.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetwarden.sim.fleet_spec import Fleet, Model, Placement
from fleetwarden.sim.planning import EndpointKey


@dataclass(frozen=True)
class StaticPlacement:
    """The instances `static` starts each endpoint with, and why some got fewer than asked."""

    instances: dict[EndpointKey, int]
    shortfalls: tuple[str, ...]
    """One sentence per endpoint pinned below its `maxInstances`."""


def _order(item: tuple[Model, Placement]) -> tuple[str, str, str]:
    model, placement = item
    return (model.created, model.key, placement.pool)


def static_placement(fleet: Fleet) -> StaticPlacement:
    """Every endpoint at `maxInstances`, clamped to its pool's remaining capacity in creation
    order (module docstring)."""
    used_instances: dict[str, int] = {}
    used_gpus: dict[str, int] = {}
    instances: dict[EndpointKey, int] = {}
    shortfalls: list[str] = []
    demands = [(m, p) for m in fleet.models.values() for p in m.placements]
    for model, placement in sorted(demands, key=_order):
        capacity = fleet.pools[placement.pool].spec.capacity
        held_instances = used_instances.get(placement.pool, 0)
        held_gpus = used_gpus.get(placement.pool, 0)
        wanted = placement.max_instances
        fits = wanted
        if capacity.instances is not None:
            fits = min(fits, max(0, capacity.instances - held_instances))
        gpus = placement.gpus_per_instance
        if capacity.gpus is not None and gpus > 0:
            fits = min(fits, max(0, capacity.gpus - held_gpus) // gpus)
        instances[model.key, placement.pool] = fits
        used_instances[placement.pool] = held_instances + fits
        used_gpus[placement.pool] = held_gpus + fits * gpus
        if fits < wanted:
            shortfalls.append(
                f"static: {model.key} on pool {placement.pool} pinned at {fits} of its "
                f"{wanted} maxInstances ({gpus} GPU{'s' if gpus != 1 else ''} each): pool capacity "
                f"{_capacity(capacity.instances, capacity.gpus)}, of which {held_instances} "
                f"instances / {held_gpus} GPUs went to endpoints placed before it (creation order)"
            )
    return StaticPlacement(instances, tuple(shortfalls))


def _capacity(instances: int | None, gpus: int | None) -> str:
    parts = [f"{instances} instances" if instances is not None else None]
    parts.append(f"{gpus} GPUs" if gpus is not None else None)
    shown = [p for p in parts if p is not None]
    return " / ".join(shown) if shown else "unbounded"
