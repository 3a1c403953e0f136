"""From the planner's instance counts to per-endpoint targets that keep every user bound.

Part of the hourly round (`hourly.py`). The planner bounds a (model, region)'s sum of instances
by the sum of its placements' [minInstances, maxInstances]: it cannot see a placement's own
bounds, and when pools are too small for the minimums it returns a plan short of them (`short_min`).
The targets the round returns must nevertheless keep every placement within its own [min, max]
(the scaler enforces them too), and must not overfill a pool unless the minimums and held regions
alone do. Two steps get there, both on the ledger of GPUs and instance slots left per pool (`Free`):

1. `per_placement`: every non-held endpoint is raised to its minInstances, taking the instances
   from placements of the same (model, region) above their own minimum first (the planner's
   region total is kept when it can be), then lowered to its maxInstances, giving the excess to
   such placements with room and with free GPUs and slots in their pools.
2. `relieve`: a minimum raised into a pool the planner had filled overfills it. Such a pool then
   sheds instances of its other non-held endpoints above their minimum, moved to another placement
   of the same (model, region) where it has room and its pool has space, dropped otherwise. A pool
   still over its capacity afterwards holds only minimums and held replicas: it is overcommitted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

EndpointKey = tuple[str, str]
"""(ModelDeployment `namespace/name`, RegionPool name): one serving Deployment."""

Free = dict[str, tuple[int | None, int | None]]
"""Pool name -> (GPUs, instance slots) left; None where the pool gives no such bound; negative
when overfilled."""


@dataclass(frozen=True)
class Resolved:
    """One endpoint joined with its pool: where it runs, its bounds and what an instance is."""

    key: EndpointKey
    region: str
    min_instances: int
    max_instances: int
    throughput: float
    gpus: int

    @property
    def pool(self) -> str:
        return self.key[1]


def free_add(free: Free, e: Resolved, instances: int) -> None:
    """Give `instances` of `e` back to its pool (take them when negative)."""
    gpus, slots = free.get(e.pool, (None, None))
    free[e.pool] = (
        None if gpus is None else gpus + instances * e.gpus,
        None if slots is None else slots + instances,
    )


def fits(free: Free, e: Resolved) -> bool:
    """One more instance of `e` fits in what its pool has left."""
    gpus, slots = free.get(e.pool, (None, None))
    return (gpus is None or gpus >= e.gpus) and (slots is None or slots >= 1)


def over(free: Free, pool: str) -> bool:
    """The pool's targets exceed its GPUs or its instance slots."""
    gpus, slots = free.get(pool, (None, None))
    return (gpus is not None and gpus < 0) or (slots is not None and slots < 0)


def _move(targets: dict[EndpointKey, int], free: Free, e: Resolved, step: int) -> None:
    targets[e.key] += step
    free_add(free, e, -step)


def per_placement(targets: dict[EndpointKey, int], members: list[Resolved], free: Free) -> None:
    """Bring every placement of one planned (model, region) within its own [min, max].

    Raising to a minimum is never refused (the user's minimum holds even in a full pool; `relieve`
    then makes room); the instances come from siblings above their minimum, those in overfilled
    pools first. Instances over a maximum go only to siblings whose pools have room, else they
    are dropped.
    """
    for e in members:
        short = e.min_instances - targets[e.key]
        if short <= 0:
            continue
        _move(targets, free, e, short)
        for _ in range(short):
            donors = [o for o in members if targets[o.key] > o.min_instances]
            if not donors:
                break
            best = max(
                donors, key=lambda o: (over(free, o.pool), targets[o.key] - o.min_instances, o.key)
            )
            _move(targets, free, best, -1)
    for e in members:
        excess = targets[e.key] - e.max_instances
        if excess <= 0:
            continue
        _move(targets, free, e, -excess)
        for _ in range(excess):
            takers = [o for o in members if targets[o.key] < o.max_instances and fits(free, o)]
            if not takers:
                break
            best = max(takers, key=lambda o: (o.max_instances - targets[o.key], o.key))
            _move(targets, free, best, 1)


def relieve(
    targets: dict[EndpointKey, int],
    endpoints: Mapping[str, list[Resolved]],
    held: set[EndpointKey],
    free: Free,
) -> tuple[tuple[str, ...], dict[EndpointKey, int]]:
    """Empty overfilled pools down to their capacity where minimums and held regions allow.

    Returns the pools still overfilled (overcommitted by minInstances and held replicas) and the
    instances dropped per endpoint (moved ones are not counted: they still serve their region).
    """
    dropped: dict[EndpointKey, int] = {}
    everyone = [e for members in endpoints.values() for e in members]
    for name in sorted(free):
        while over(free, name):
            movable = [e for e in everyone if e.pool == name and e.key not in held]
            movable = [e for e in movable if targets[e.key] > e.min_instances]
            if not movable:
                break
            moves = [(e, _destination(targets, endpoints[e.key[0]], e, free)) for e in movable]
            # A move keeps the instance serving; otherwise cut where most is left above minimum.
            e, to = max(
                moves,
                key=lambda m: (m[1] is not None, targets[m[0].key] - m[0].min_instances, m[0].key),
            )
            _move(targets, free, e, -1)
            if to is not None:
                _move(targets, free, to, 1)
            else:
                dropped[e.key] = dropped.get(e.key, 0) + 1
    return tuple(name for name in sorted(free) if over(free, name)), dropped


def _destination(
    targets: Mapping[EndpointKey, int], siblings: list[Resolved], e: Resolved, free: Free
) -> Resolved | None:
    """Another placement of e's (model, region) with room and pool space for one instance."""
    options = [
        o
        for o in siblings
        if o.region == e.region
        and o.key != e.key
        and targets[o.key] < o.max_instances
        and fits(free, o)
    ]
    return max(options, key=lambda o: (o.max_instances - targets[o.key], o.key), default=None)
