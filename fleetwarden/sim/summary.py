"""Turn a finished `FleetSimulation` into `SimResults`: close the books at the end time.

Kept apart from the event loop so the loop holds only what changes while it runs. Instances
still alive are billed up to the end. Every request still in the fleet (queued or running on an
instance, waiting for an instance in its region, or queued for a NIW release) is found where it
waits and counted as pending, not inferred as what is left over, so `pending_at_end` is a count
the conservation check (`fleetwarden.sim.conservation`) can hold against the others; a pending
request counts as served up to its first token if it had one (TTFT, SLA), else enters the TTFT
percentiles censored at its wait so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from fleetwarden.api.enums import Tier
from fleetwarden.sim.fleet_engine import FleetRunning
from fleetwarden.sim.instance import Job
from fleetwarden.sim.results import SimResults

if TYPE_CHECKING:
    from fleetwarden.sim.cluster import FleetSimulation, SimOptions
    from fleetwarden.sim.fleet_spec import Fleet

SAMPLE_COLUMNS = (
    "time_s",
    "ready",
    "loading",
    "draining",
    "utilisation",
    "target",
    "donated",
    "demand_tps",
)
PLAN_COLUMNS = ("time_s", "target", "forecast_tps", "forecast_model")
EVENT_COLUMNS = ("time_s", "endpoint", "step", "reason", "instance", "ready_s")


class _Stats(Protocol):
    instance_hours: float
    gpu_hours: float
    cost: float
    cold_start_gpu_hours: float
    donated_instance_hours: float
    launches: int
    scale_out: int
    scale_in: int


def tier_targets(fleet: Fleet) -> dict[Tier, float | None]:
    """Each tier's TTFT target: the first ModelDeployment (load order) that sets one."""
    targets: dict[Tier, float | None] = {t: None for t in Tier}
    for model in fleet.models.values():
        for tier, target in model.fairness.tiers.items():
            if targets[tier] is None:
                targets[tier] = target.ttft_s
    return targets


def capacity_totals(stats: Sequence[_Stats]) -> dict[str, Any]:
    """The fleet's instance-hours, GPU-hours, cost and scaling counts, summed over endpoints."""
    return {
        "instance_hours": sum(s.instance_hours for s in stats),
        "gpu_hours": sum(s.gpu_hours for s in stats),
        "cost": sum(s.cost for s in stats),
        "cold_start_gpu_hours": sum(s.cold_start_gpu_hours for s in stats),
        "donated_instance_hours": sum(s.donated_instance_hours for s in stats),
        "launches": sum(s.launches for s in stats),
        "scale_out": sum(s.scale_out for s in stats),
        "scale_in": sum(s.scale_in for s in stats),
    }


def run_meta(
    fleet: Fleet, options: SimOptions, planner: object, end: float, fidelity: str
) -> dict[str, Any]:
    """`meta` fields both fidelities share (each adds its own)."""
    return {
        "fidelity": fidelity,
        "durationSeconds": end,
        "seed": options.seed,
        "strategy": options.strategy.value if options.strategy else "per-model",
        "scaling": options.scaling,
        "planner": type(planner).__name__,
        "periodSeconds": options.period_s,
        "thetaLoad": options.theta_load,
        "models": {
            m.key: {
                "servedName": m.served_name,
                "strategy": (options.strategy or m.spec.scaling.strategy).value,
                "policy": m.fairness.policy.value,
            }
            for m in fleet.models.values()
        },
        "placement": "synthetic",
    }


def series_tables(samples: Any, plans: Any, events: Any) -> dict[str, Any]:
    """The time series both fidelities record: samples, plans and scaling events."""
    return {
        "sampleColumns": list(SAMPLE_COLUMNS),
        "samples": samples,
        "planColumns": list(PLAN_COLUMNS),
        "plans": plans,
        "eventColumns": list(EVENT_COLUMNS),
        "events": events,
    }


def _profile(sim: FleetSimulation, key: tuple[str, str]) -> dict[str, Any]:
    profile = sim.endpoints[key].profile
    return {
        "name": profile.name,
        "kvBudgetTokens": profile.kv_budget_tokens,
        "prefillCapTokens": profile.prefill_cap_tokens,
        "prefillSecondsPerToken": profile.prefill_per_token_s,
        "decodeBaseSeconds": profile.decode_base_s,
    }


def collect(sim: FleetSimulation, end: float) -> SimResults:
    recorder = sim.recorder
    for instance in list(sim.instances.values()):
        for running in instance.engine.running:
            assert isinstance(running, FleetRunning)
            job: Job = running.tag
            recorder.unfinished(job, end)
        for job in [*instance.inbox, *instance.jobs.values()]:
            recorder.unfinished(job, end)
    for unrouted in sim.pending.values():
        for job in unrouted:
            recorder.unfinished(job, end)
    for queue in sim.niw.values():
        for job in queue.jobs():
            recorder.unfinished(job, end)
    for endpoint in sim.endpoints.values():
        endpoint.close(end)
    endpoints = {f"{k[0]}/{k[1]}": e.stats for k, e in sim.endpoints.items()}
    stats = list(endpoints.values())
    tiers = recorder.tier_results(tier_targets(sim.fleet))
    arrived = sum(t.requests for t in tiers.values())
    totals = {
        **capacity_totals(stats),
        "requests": arrived,
        "completed": sum(t.completed for t in tiers.values()),
        "throttled": sum(t.throttled for t in tiers.values()),
        "throttled_tokens": sum(t.throttled_tokens for t in recorder.tenants.values()),
        "rejected": sum(t.rejected for t in tiers.values()),
        "spilled": recorder.spilled,
        "abandoned": recorder.abandoned,
        "pending_at_end": sum(t.pending for t in tiers.values()),
    }
    options = sim.options
    meta = run_meta(sim.fleet, options, sim.planner, end, "request-level")
    meta["exactDynamicHeads"] = options.exact_dynamic_heads
    for model in sim.fleet.models.values():
        meta["models"][model.key].update(
            {"ordering": model.fairness.ordering.value, "policySource": model.fairness.source}
        )
    meta["profiles"] = {f"{k[0]}/{k[1]}": _profile(sim, k) for k in sim.endpoints}
    series = series_tables(sim.samples, sim.plans, sim.events)
    series["tenantPeriodSeconds"] = options.tenant_period_s
    return SimResults(
        meta=meta,
        totals=totals,
        endpoints=endpoints,
        tiers=tiers,
        niw=recorder.niw,
        tenants=dict(sorted(recorder.tenants.items())),
        series=series,
        jain_index=recorder.jain_index(),
        requests=recorder.requests,
    )
