"""What the hourly plan leaves for the ModelDeployment reconcile: per-endpoint records, per-model
health, and the status fields, conditions and Event the reconcile writes from them.

The planner (operator/hourly_planner.py) runs in the background and never writes to the API:
like the metrics poller, it fills shared memory and asks for reconciles, and the reconcile is the
only writer of a ModelDeployment's status. So this module is pure bookkeeping plus the one
function the reconcile calls (`apply_plan_status`); no I/O, the time is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fleetwarden.operator.autoscaler import RegionKey
from fleetwarden.operator.conditions import ConditionUpdate

PLANNED = "Planned"
FORECAST_HEALTHY = "ForecastHealthy"

# Reasons of the Planned condition.
PLAN_APPLIED = "Planned"
PROMETHEUS_UNAVAILABLE = "PrometheusUnavailable"
NO_HISTORY = "NoHistory"
PLANNER_FAILED = "PlannerFailed"
NOT_PLANNABLE = "NotPlannable"
# Reasons of the ForecastHealthy condition.
ARIMA = "Arima"
FORECAST_FALLBACK = "ForecastFallback"
NO_DATA = "NoData"

PLAN_EVENT = "Planned"


@dataclass(frozen=True)
class EndpointRecord:
    """The last plan for one endpoint, as status shows it."""

    region: str
    current: int
    """Replicas when the plan was made."""
    target: int
    peak_tps: float | None
    """Planned peak of the (model, region): forecast peak + beta x NIW; None when held."""
    forecast_model: str
    healthy: bool
    fallback_reason: str | None
    held: bool
    forecast_time_s: float
    plan_time_s: float


@dataclass(frozen=True)
class PlanHealth:
    """The Planned condition of one ModelDeployment."""

    planned: bool
    reason: str
    message: str


@dataclass
class PlanBook:
    """Kept for the operator's life; written by the planner, read by reconciles."""

    endpoints: dict[RegionKey, EndpointRecord] = field(default_factory=dict)
    health: dict[str, PlanHealth] = field(default_factory=dict)
    """Per ModelDeployment key, from the last round that reached it."""
    outage: PlanHealth | None = None
    """Set while the last round failed as a whole (Prometheus down, the solver failed): it
    overrides every ModelDeployment's health, and their last plans stay in force."""

    def health_of(self, model_deployment: str) -> PlanHealth | None:
        if self.outage is not None:
            return self.outage
        return self.health.get(model_deployment)

    def records_of(self, model_deployment: str) -> dict[str, EndpointRecord]:
        """Pool -> record of one ModelDeployment."""
        return {pool: r for (md, pool), r in self.endpoints.items() if md == model_deployment}

    def forget(self, model_deployment: str) -> None:
        self.health.pop(model_deployment, None)
        for key in [k for k in self.endpoints if k[0] == model_deployment]:
            del self.endpoints[key]


def rfc3339(seconds: float) -> str:
    return (
        datetime.fromtimestamp(seconds, UTC)
        .replace(microsecond=0)
        .isoformat()
        .replace("+00:00", "Z")
    )


def _forecast_condition(records: dict[str, EndpointRecord]) -> ConditionUpdate:
    """False with the fallback reasons when any region did not run the default model (ARIMA)."""
    degraded = {
        r.region: f"{r.region}: {r.forecast_model} ({r.fallback_reason or 'no reason given'})"
        for r in records.values()
        if not r.healthy
    }
    if not degraded:
        models = sorted({r.forecast_model for r in records.values()})
        return ConditionUpdate(FORECAST_HEALTHY, True, ARIMA, f"every region: {', '.join(models)}")
    reason = (
        NO_DATA if all(r.held for r in records.values() if not r.healthy) else FORECAST_FALLBACK
    )
    return ConditionUpdate(FORECAST_HEALTHY, False, reason, "; ".join(degraded.values()))


def apply_plan_status(
    book: PlanBook | None, model_deployment: str, regions: list[dict[str, Any]]
) -> tuple[list[ConditionUpdate], str | None]:
    """Write the last plan into `regions` (status.regions[], camelCase, updated in place) and
    return the conditions plus the Event message when this plan is new to this status.

    "New" is judged against the status itself (a region's lastPlanTime changes), so one plan
    produces one Event however many reconciles follow, and a restarted operator that re-plans
    announces its first plan once.
    """
    if book is None:
        return [], None
    records = book.records_of(model_deployment)
    changed: list[str] = []
    for region in regions:
        record = records.get(str(region.get("pool")))
        if record is None:
            continue
        plan_time = rfc3339(record.plan_time_s)
        if region.get("lastPlanTime") != plan_time:
            peak = "no data, held" if record.peak_tps is None else f"{record.peak_tps:.0f} tokens/s"
            changed.append(
                f"{region.get('pool')} {record.current} -> {record.target} "
                f"({peak}, {record.forecast_model})"
            )
        region["target"] = record.target
        region["lastPlanTime"] = plan_time
        region["lastForecastTime"] = rfc3339(record.forecast_time_s)
        if record.peak_tps is not None:
            region["lastForecastPeak"] = round(record.peak_tps, 3)
    updates: list[ConditionUpdate] = []
    health = book.health_of(model_deployment)
    if health is not None:
        updates.append(ConditionUpdate(PLANNED, health.planned, health.reason, health.message))
    if records:
        updates.append(_forecast_condition(records))
    message = "new plan: " + "; ".join(changed) if changed else None
    return updates, message
