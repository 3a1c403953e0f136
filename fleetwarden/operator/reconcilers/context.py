"""What every reconciler needs from the outside world, and the status-write guard they share."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetwarden.operator import conditions
from fleetwarden.operator.autoscaler import Autoscaler
from fleetwarden.operator.conditions import ConditionUpdate
from fleetwarden.operator.config_push import ConfigPusher
from fleetwarden.operator.events import WARNING, EventSink
from fleetwarden.operator.fleet import ObjectRecord
from fleetwarden.operator.kube import KubeClient, ResourceKind
from fleetwarden.operator.plan_status import PlanBook


@dataclass(frozen=True)
class Context:
    """The API client, the Event sink, defaults from the command line, and the clock."""

    kube: KubeClient
    events: EventSink
    sidecar_image: str
    now: Callable[[], str]
    """Current time as RFC 3339 text; injected so tests control it."""
    pusher: ConfigPusher = field(default_factory=ConfigPusher)
    """Pushes rendered fairness configs to live sidecars and counts acknowledgements."""
    autoscaler: Autoscaler | None = None
    """Scaling decisions from Prometheus signals; None when no Prometheus is configured (the
    replicas then stay where the last decision left them, `minInstances` at first)."""
    clock: Callable[[], float] = time.time
    """Seconds since the epoch, for scaling cooldowns and plan periods; injected by tests."""
    plans: PlanBook | None = None
    """The hourly fleet plan's per-region records and Planned health (operator/hourly_planner.py);
    None when no Prometheus is configured (no plan: status shows no target)."""


def status_unchanged(current: dict[str, Any], desired: dict[str, Any]) -> bool:
    """Whether merge-patching `desired` (None removes a field) would leave `current` as it is.

    Reconcilers skip unchanged status writes: each write is an event that wakes every watcher,
    and an operator that writes on every pass never goes quiet.
    """
    return all(
        current.get(key) == value if value is not None else key not in current
        for key, value in desired.items()
    )


def invalid_spec(message: str) -> list[ConditionUpdate]:
    """Conditions of an object whose spec does not parse: not Ready, Degraded, with the reason."""
    return [
        ConditionUpdate(conditions.READY, False, conditions.INVALID_SPEC, message),
        ConditionUpdate(conditions.DEGRADED, True, conditions.INVALID_SPEC, message),
    ]


async def write_status(
    ctx: Context,
    kind: ResourceKind,
    record: ObjectRecord,
    status: dict[str, Any],
    updates: list[ConditionUpdate],
) -> None:
    """Merge `updates` into the conditions, post a Warning for each new problem, patch if changed.

    Events fire on transitions only (a new Degraded reason), so a problem that persists across
    reconciles is reported once, not every resync.
    """
    current = record.status.get("conditions") or []
    for update in conditions.transitions(current, updates):
        if update.type == conditions.DEGRADED and update.status:
            ctx.events.post(record, WARNING, update.reason, update.message)
    status = {
        "observedGeneration": record.generation,
        **status,
        "conditions": conditions.merge_conditions(
            current, updates, now=ctx.now(), generation=record.generation
        ),
    }
    if not status_unchanged(record.status, status):
        await ctx.kube.patch_status(kind, record.name, status, record.namespace)
