"""What the hourly plan leaves for the ModelDeployment reconcile: per-endpoint records, per-model
health, and the status fields, conditions and Event the reconcile writes from them.

The planner (operator/hourly_planner.py) runs in the background and never writes to the API:
like the metrics poller, it fills shared memory and asks for reconciles, and the reconcile is the
only writer of a ModelDeployment's status. So this module is pure bookkeeping plus the one
function the reconcile calls (`apply_plan_status`); no I/O, the time is passed in.
"""

from __future__ import annotations

from collections.abc import Collection
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

    def forget_regions(self, model_deployment: str, keep_pools: Collection[str]) -> None:
        """Drop the records of `model_deployment`'s pools outside `keep_pools` (regions its
        spec no longer names); its health stays, it is per ModelDeployment."""
        for key in [
            k for k in self.endpoints if k[0] == model_deployment and k[1] not in keep_pools
        ]:
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


PLAN_FIELDS = ("target", "lastPlanTime", "lastForecastTime", "lastForecastPeak")
"""The fields of a `status.regions[]` entry that show a plan. Without a plan in force they are
absent, as in a region never planned and as `targetInstances` is (the reconcile's None removes it
in the merge patch), so `kubectl get -o yaml` shows no target rather than a stale or null one."""


def _no_plan_conditions(health: PlanHealth, outage: bool) -> list[ConditionUpdate]:
    """Planned and ForecastHealthy of a ModelDeployment the planner holds no plan for: both False
    with the reason (NotPlannable and what is invalid, say), so neither keeps saying that the
    last plan or forecast is in force."""
    message = health.message
    if outage:  # the fleet-wide message says "the previous plan stays in force": not this one's
        message += "; this ModelDeployment has no plan in force"
    return [
        ConditionUpdate(PLANNED, False, health.reason, message),
        ConditionUpdate(FORECAST_HEALTHY, False, health.reason, f"no forecast in force: {message}"),
    ]


def apply_plan_status(
    book: PlanBook | None, model_deployment: str, regions: list[dict[str, Any]]
) -> tuple[list[ConditionUpdate], str | None]:
    """Write the last plan into `regions` (status.regions[], camelCase, updated in place) and
    return the conditions plus the Event message when this plan is new to this status.

    "New" is judged against the status itself (a region's lastPlanTime changes), so one plan
    produces one Event however many reconciles follow, and a restarted operator that re-plans
    announces its first plan once.

    Once the planner has a word on this ModelDeployment (a round reached it, or the last round
    failed), a region without a record has no plan in force (the planner dropped it, e.g. for a
    ModelDeployment it could not plan), so its plan fields are removed. Before that (an operator
    that just started) the status is left as it is until the first round, which comes at once.
    """
    if book is None:
        return [], None
    records = book.records_of(model_deployment)
    health = book.health_of(model_deployment)
    changed: list[str] = []
    for region in regions:
        record = records.get(str(region.get("pool")))
        if record is None:
            if health is not None:
                for key in PLAN_FIELDS:
                    region.pop(key, None)
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
        region.pop("lastForecastPeak", None)  # held: this forecast expected nothing
        if record.peak_tps is not None:
            region["lastForecastPeak"] = round(record.peak_tps, 3)
    updates: list[ConditionUpdate] = []
    if health is not None and not records and not health.planned:
        updates = _no_plan_conditions(health, outage=health is book.outage)
    elif health is not None:
        updates.append(ConditionUpdate(PLANNED, health.planned, health.reason, health.message))
    if records:
        updates.append(_forecast_condition(records))
    message = "new plan: " + "; ".join(changed) if changed else None
    return updates, message


def target_instances(regions: list[dict[str, Any]]) -> int | None:
    """`status.targetInstances`: the regions' targets summed; None (absent) when none has one."""
    targets = [r["target"] for r in regions if isinstance(r.get("target"), int)]
    return sum(targets) if targets else None


def kept_regions_plan_status(
    book: PlanBook | None, model_deployment: str, status: dict[str, Any]
) -> tuple[dict[str, Any], list[ConditionUpdate]]:
    """The plan part of status for a reconcile that rebuilds no region (an invalid spec): the
    last `status.regions` with their plan fields as `apply_plan_status` leaves them, the sum, and
    the conditions. The planner leaves such a ModelDeployment out and drops its plan, so without
    this its status would keep the old targets and `Planned=True`."""
    if book is None:
        return {}, []
    regions = [dict(r) for r in status.get("regions") or [] if isinstance(r, dict)]
    updates, _ = apply_plan_status(book, model_deployment, regions)
    fields: dict[str, Any] = {"targetInstances": target_instances(regions)}
    if "regions" in status:
        fields["regions"] = regions
    return fields, updates
