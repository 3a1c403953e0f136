"""Condition types, reasons and the one function that updates a conditions list.

Types and reasons are named constants so that tests, docs and `kubectl wait --for=condition=...`
all use the same words. `lastTransitionTime` changes only when a condition's status changes, as
metav1.Condition requires; that also keeps status writes idempotent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
SCALING = "Scaling"
METRICS_AVAILABLE = "MetricsAvailable"
PROMETHEUS_UNAVAILABLE = "PrometheusUnavailable"
NO_METRICS = "NoMetrics"

# Reasons.
RECONCILED = "Reconciled"
PODS_NOT_READY = "PodsNotReady"
ROLLING_OUT = "RollingOut"
AS_EXPECTED = "AsExpected"
INVALID_SPEC = "InvalidSpec"
POOL_NOT_FOUND = "PoolNotFound"
POOL_INVALID = "PoolInvalid"
THROUGHPUT_MISSING = "ThroughputMissing"
INSUFFICIENT_POOL_CAPACITY = "InsufficientPoolCapacity"
POLICY_CONFLICT = "TenantPolicyConflict"
POLICY_INVALID = "TenantPolicyInvalid"
SERVED_NAME_CONFLICT = "ServedNameConflict"
APPLY_FAILED = "ApplyFailed"
OVERCOMMITTED = "Overcommitted"
NO_MATCHES = "NoModelDeploymentsSelected"
LEGACY_SELECTOR = "LegacySelector"
"""Degraded reason: a Deployment kept the selector an operator before unique values gave it."""

MAX_CONDITIONS = 16


@dataclass(frozen=True)
class ConditionUpdate:
    """The condition a reconcile wants; the time is filled in only on a transition."""

    type: str
    status: bool
    reason: str
    message: str

    @property
    def status_text(self) -> str:
        return "True" if self.status else "False"


def merge_conditions(
    current: Iterable[Mapping[str, Any]],
    updates: Iterable[ConditionUpdate],
    *,
    now: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    """Apply `updates` to `current`: keep transition times of unchanged statuses, cap the list."""
    by_type: dict[str, dict[str, Any]] = {str(c["type"]): dict(c) for c in current}
    for update in updates:
        old = by_type.get(update.type)
        changed = old is None or old.get("status") != update.status_text
        condition: dict[str, Any] = {
            "type": update.type,
            "status": update.status_text,
            "reason": update.reason,
            "message": update.message,
            "lastTransitionTime": now if changed or old is None else old["lastTransitionTime"],
        }
        if generation is not None:
            condition["observedGeneration"] = generation
        by_type[update.type] = condition
    ordered = sorted(by_type.values(), key=lambda c: str(c["type"]))
    return ordered[:MAX_CONDITIONS]


def transitions(
    current: Iterable[Mapping[str, Any]], updates: Iterable[ConditionUpdate]
) -> list[ConditionUpdate]:
    """The updates whose status or reason differs from `current`: what deserves an Event."""
    by_type = {str(c["type"]): c for c in current}
    return [
        u
        for u in updates
        if (old := by_type.get(u.type)) is None
        or old.get("status") != u.status_text
        or old.get("reason") != u.reason
    ]
