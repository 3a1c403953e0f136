"""Turn a finished `FleetSimulation` into `SimResults`: close the books at the end time.

Kept apart from the event loop so the loop holds only what changes while it runs. Instances
still alive are billed up to the end; requests still running count as served up to their first
token (for TTFT and SLA) but not as completed; NIW items still queued or running are pending.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetwarden.api.enums import Tier
from fleetwarden.sim.fleet_engine import FleetRunning
from fleetwarden.sim.instance import Job
from fleetwarden.sim.results import SimResults

if TYPE_CHECKING:
    from fleetwarden.sim.cluster import FleetSimulation

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
PLAN_COLUMNS = ("time_s", "target", "forecast_tps")


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
    pending_niw = 0
    for instance in list(sim.instances.values()):
        waiting: list[Job] = [*instance.inbox, *instance.jobs.values()]
        for running in instance.engine.running:
            assert isinstance(running, FleetRunning)
            job: Job = running.tag
            if running.first_token_s is not None and running.first_token_s <= end:
                recorder.started_only(job)
            if job.niw_deadline_s is not None:
                recorder.pending_niw(job, end)
                pending_niw += 1
        for job in waiting:
            if job.niw_deadline_s is not None:
                recorder.pending_niw(job, end)
                pending_niw += 1
    for queue in sim.niw.values():
        for job in queue.jobs():
            recorder.pending_niw(job, end)
    for endpoint in sim.endpoints.values():
        endpoint.close(end)
    endpoints = {f"{k[0]}/{k[1]}": e.stats for k, e in sim.endpoints.items()}
    stats = list(endpoints.values())
    targets: dict[Tier, float | None] = {t: None for t in Tier}
    for model in sim.fleet.models.values():
        for tier, target in model.fairness.tiers.items():
            if targets[tier] is None:
                targets[tier] = target.ttft_s
    tiers = recorder.tier_results(targets)
    arrived = sum(t.requests for t in tiers.values())
    totals = {
        "instance_hours": sum(s.instance_hours for s in stats),
        "gpu_hours": sum(s.gpu_hours for s in stats),
        "cost": sum(s.cost for s in stats),
        "cold_start_gpu_hours": sum(s.cold_start_gpu_hours for s in stats),
        "donated_instance_hours": sum(s.donated_instance_hours for s in stats),
        "launches": sum(s.launches for s in stats),
        "scale_out": sum(s.scale_out for s in stats),
        "scale_in": sum(s.scale_in for s in stats),
        "requests": arrived,
        "completed": sum(t.completed for t in tiers.values()),
        "throttled": sum(t.throttled for t in tiers.values()),
        "throttled_tokens": sum(t.throttled_tokens for t in recorder.tenants.values()),
        "rejected": sum(t.rejected for t in tiers.values()),
        "spilled": recorder.spilled,
        "abandoned": recorder.abandoned,
        "pending_at_end": arrived
        - sum(t.completed + t.throttled + t.rejected for t in tiers.values())
        - recorder.abandoned,
    }
    options = sim.options
    meta = {
        "fidelity": "request-level",
        "durationSeconds": end,
        "seed": options.seed,
        "strategy": options.strategy.value if options.strategy else "per-model",
        "scaling": options.scaling,
        "planner": type(sim.planner).__name__,
        "periodSeconds": options.period_s,
        "thetaLoad": options.theta_load,
        "exactDynamicHeads": options.exact_dynamic_heads,
        "models": {
            m.key: {
                "servedName": m.served_name,
                "strategy": (options.strategy or m.spec.scaling.strategy).value,
                "policy": m.fairness.policy.value,
                "ordering": m.fairness.ordering.value,
                "policySource": m.fairness.source,
            }
            for m in sim.fleet.models.values()
        },
        "profiles": {f"{k[0]}/{k[1]}": _profile(sim, k) for k in sim.endpoints},
        "placement": "synthetic",
    }
    series = {
        "sampleColumns": list(SAMPLE_COLUMNS),
        "samples": sim.samples,
        "planColumns": list(PLAN_COLUMNS),
        "plans": sim.plans,
        "eventColumns": ["time_s", "endpoint", "step", "reason", "instance", "ready_s"],
        "events": sim.events,
        "tenantPeriodSeconds": options.tenant_period_s,
    }
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
