"""Where a request goes, and the scheduler's view of it (SageServe 6.1, as the simulator does it).

- Within a region, the least-loaded ready instance (join the shortest queue): load is KV tokens
  committed over the instance's budget, i.e. prompt plus output of every request running or
  queued there. Ties go to the oldest instance.
- An instance "has room" for a request when its committed tokens plus the request's fit its KV
  budget. If the home region's least-loaded instance has none and the ModelDeployment lets load
  leave its region (`scaling.epsilon` < 1: a region need serve only that fraction of its peak
  locally), the request spills to the least-loaded instance with room among the model's other
  regions; with no room anywhere it stays home (and queues there). With no ready instance at
  home it goes to the least-loaded one anywhere (if spilling is allowed) or waits. A request
  served outside its home region is marked spilled, whichever of these sent it there.
- The `Request` a pod's scheduler sees is built as the sidecar builds it: the tier from the
  request or else the tenant's config, the TTFT deadline from the tier's target.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from fleetwarden.api.enums import Tier
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.request import Request
from fleetwarden.sim.endpoint import Endpoint
from fleetwarden.sim.fleet_spec import Model
from fleetwarden.sim.instance import Instance, Job
from fleetwarden.sim.workload import SimRequest


def least_loaded(endpoints: Iterable[Endpoint], room_for: int = 0) -> Instance | None:
    """The ready instance with the least load; with `room_for` > 0, only those with that much
    room."""
    best: Instance | None = None
    best_load = 0.0
    for endpoint in endpoints:
        for instance in endpoint.serving:
            tokens = instance.engine.committed + instance.queued_tokens
            budget = instance.budget
            if room_for and tokens + room_for > budget:
                continue
            load = tokens / budget
            if best is None or load < best_load:
                best, best_load = instance, load
    return best


def route(
    job: Job, model: Model, by_region: Mapping[tuple[str, str], Sequence[Endpoint]]
) -> Instance | None:
    """The instance for `job` (module docstring); marks the job spilled when it leaves home."""
    home = by_region[job.model, job.home]
    best = least_loaded(home)
    if best is not None and best.engine.committed + best.queued_tokens + job.tokens <= best.budget:
        return best  # room at home (`load_tokens`, inlined: this runs for every request)
    if model.spec.scaling.epsilon >= 1.0:
        return best
    spill: Instance | None = None
    spill_load = 0.0
    for region in model.regions:
        if region == job.home:
            continue
        candidate = least_loaded(by_region[job.model, region], job.tokens)
        if candidate is not None:
            load = candidate.load_tokens() / candidate.budget
            if spill is None or load < spill_load:
                spill, spill_load = candidate, load
    if spill is not None:
        job.spilled = True
        return spill
    if best is None:  # no ready instance at home: whatever is found lies elsewhere
        anywhere = least_loaded(e for r in model.regions for e in by_region[job.model, r])
        job.spilled = anywhere is not None
        return anywhere
    return best


def scheduler_request(
    item: SimRequest, config: FairnessConfig, tier: Tier, t: float, seq: int
) -> Request:
    """The request as the pod's scheduler sees it, arriving at `t`."""
    target = config.tiers.get(tier)
    if item.deadline_s is not None and tier is not Tier.NIW:
        deadline: float | None = t + item.deadline_s
    else:
        deadline = None if target is None else t + target.ttft_s
    # Positional (seq, tenant, arrival, input, output, system, app, interaction, stage,
    # continuation, tier, deadline): one is built per request, and keywords cost more.
    return Request(
        seq,
        item.tenant,
        t,
        item.input_tokens,
        item.output_tokens,
        item.system_tokens,
        item.app,
        item.interaction,
        item.stage,
        False,
        tier,
        deadline,
    )


def released_request(old: Request, config: FairnessConfig, tier: Tier, t: float) -> Request:
    """A NIW item's request as the batch dispatcher sends it at `t` (promoted: tier iw-n)."""
    target = config.tiers.get(tier)
    return Request(
        seq=old.seq,
        tenant=old.tenant,
        arrival_s=t,
        input_tokens=old.input_tokens,
        max_output_tokens=old.max_output_tokens,
        system_tokens=old.system_tokens,
        app=old.app,
        interaction=old.interaction,
        stage=old.stage,
        tier=tier,
        deadline_s=None if target is None else t + target.ttft_s,
    )
