"""How many spot replicas a (model, region) queue needs (pure; the operator calls it).

A scaling core, like the release rule: the operator (which sizes spot Deployments) and the batch
service (whose metrics are the inputs) are sibling shells that may not import each other.

A spot Deployment exists only to run NIW backlog, so its replicas follow the queue: zero when
nothing is waiting, enough to drain the backlog within a horizon, and more when deadlines are at
risk, up to a maximum.

Deadline pressure is the earliest-deadline-first feasibility bound. If `n(s)` queued items are due
within `s` seconds, finishing them in time needs a throughput of at least `n(s) / s`; the queue
needs the largest such rate over all horizons. Whatever the shared (non-spot) capacity already
delivers is subtracted, and the rest is divided by one spot replica's throughput. Items that
would miss their deadline at the current throughput are reported too, as `at_risk_items`.

The inputs map to the batch service's metrics: `fleetwarden_niw_backlog_items` (+ in flight),
`fleetwarden_niw_backlog_due_items{within_seconds}` (the cumulative deadline profile) and the rate
of `fleetwarden_niw_items_total{outcome="completed"}` from shared targets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SpotDemand:
    """What the queue holds and what shared capacity already does for it."""

    backlog_items: int
    """Items not yet finished (queued or in flight)."""
    due: Sequence[tuple[float, int]] = ()
    """Cumulative deadline profile: `(within_s, n)` = n items due within `within_s` seconds.
    Per-item deadlines work too (one point per item, n counting up)."""
    shared_items_per_s: float = 0.0
    """NIW items/s the shared (interactive) capacity currently completes for this queue."""


@dataclass(frozen=True, slots=True)
class SpotSizing:
    """The spot Deployment's capacity and bounds."""

    items_per_replica_per_s: float
    """Items/s one spot replica completes (measured, or throughput / mean tokens per item)."""
    max_replicas: int
    """ModelDeployment `niw.spot.maxInstances` (and the pool's spot bound)."""
    drain_s: float | None = 3600.0
    """Run enough replicas to clear the whole backlog within this many seconds even when no
    deadline is near; None sizes by deadline pressure alone."""
    min_horizon_s: float = 60.0
    """Deadlines nearer than this count as this far: no finite capacity meets a deadline that
    is due now, and one about-to-expire item must not ask for the maximum."""


@dataclass(frozen=True, slots=True)
class SpotDecision:
    """The replica count and why."""

    replicas: int
    needed_items_per_s: float
    """Throughput that meets every deadline (and the drain horizon)."""
    at_risk_items: int
    """Items that miss their deadline at the current shared throughput alone."""


def spot_replicas(demand: SpotDemand, sizing: SpotSizing) -> SpotDecision:
    """Replicas for one (model, region) spot Deployment."""
    if sizing.items_per_replica_per_s <= 0:
        raise ValueError("items_per_replica_per_s must be > 0")
    if sizing.max_replicas < 0:
        raise ValueError("max_replicas must be >= 0")
    if demand.backlog_items <= 0 or sizing.max_replicas == 0:
        return SpotDecision(0, 0.0, 0)
    shared = max(0.0, demand.shared_items_per_s)
    needed = 0.0
    at_risk = 0
    for within_s, items in sorted(demand.due):
        if items <= 0 or within_s <= 0:
            continue  # already past its deadline: the service expires it, no capacity helps
        horizon = max(within_s, sizing.min_horizon_s)
        needed = max(needed, items / horizon)
        at_risk = max(at_risk, items - math.floor(shared * within_s))
    if sizing.drain_s is not None and sizing.drain_s > 0:
        needed = max(needed, demand.backlog_items / sizing.drain_s)
    extra = max(0.0, needed - shared)
    replicas = math.ceil(extra / sizing.items_per_replica_per_s - 1e-9)
    return SpotDecision(min(sizing.max_replicas, max(0, replicas)), needed, max(0, at_risk))


def share_spot_capacity(capacity: int, wanted: Mapping[str, int]) -> dict[str, int]:
    """Split a pool's `spot.maxInstances` among the ModelDeployments that want spot replicas.

    Max-min fair (water-filling): whoever wants less than an equal share gets all of it, and
    what it leaves is shared by the others, so the pool's bound holds for the pool and not once
    per ModelDeployment, and no queue is starved while another takes the whole pool. Integer
    remainders go to the larger wants, ties by key, so every ModelDeployment's reconcile computes
    the same split from the same inputs and their decisions never add up past the bound.
    """
    if capacity < 0:
        raise ValueError("capacity must be >= 0")
    order = sorted(wanted.items(), key=lambda item: (max(0, item[1]), item[0]))
    shares: dict[str, int] = {}
    left = capacity
    for position, (key, want) in enumerate(order):
        share = min(max(0, want), left // (len(order) - position))
        shares[key] = share
        left -= share
    return shares
