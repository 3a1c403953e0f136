"""What a fleet simulation measured, and its deterministic JSON form.

Definitions (also in the report):

- instance-hours: from an instance's launch (the pod is scheduled and holds its GPUs) until it
  stops (drained, or cancelled while loading) or the run ends; GPU-hours multiply by
  `gpusPerInstance`, cost by the pool's `costPerHour` per GPU-hour.
- cold-start GPU-hours: the part of GPU-hours spent loading the model (launch to ready, or to
  cancellation); reclaiming an instance donated to spot loads faster and is counted the same way.
- donated instance-hours: instances handed to the pool's spot capacity on scale-in (SageServe
  6.4), integrated over time; they are not billed to the fleet.
- per tier: how requests ended: `requests` arrived = `completed` + `throttled` + `rejected` +
  abandoned (interactive only, counted fleet-wide) + `pending` (still in the fleet at the end;
  `pending_started` of them had their first token). `first_token`: requests whose first token
  came within the run (completed or pending_started).
- per tier: TTFT percentiles (`ttft_s`, `ttft_cdf_s`) over the requests admitted to the fleet:
  those that got a first token at their TTFT, and those still waiting for one at the end counted
  at their wait so far, end - arrival (right-censored, `fleetwarden.sim.censoring`; a percentile
  such a wait reaches is a lower bound and is listed in `ttft_lower_bound`). Throttled, rejected
  and abandoned requests got an answer, not a token: they are outside the percentiles and count
  in SLA attainment as misses. `ttft_served_s`: the percentiles over requests that got a first
  token only (the figure reported before). End-to-end percentiles cover completed requests.
- SLA attainment = requests of the tier whose first token came within the tier's TTFT target,
  over all requests of the tier that arrived (throttled, rejected, abandoned and still waiting
  count as misses); `attainment_served` counts only requests that got a first token.
- NIW: items completed by their deadline, late, and still pending at the end (with the deadline
  passed or not).
- tenants: requests and tokens (prompt + output) demanded, served (completed) and throttled; Jain's
  index over served/demanded per tenant.
- fluidity-index (Etalon, `fleetwarden.fairness.fluidity`) per completed interactive request, as
  a histogram per tier (`FLUIDITY_BINS`): the engine model emits no per-token times, so every
  request's tokens after the first are taken as evenly spaced over its decode time (its mean
  time between tokens). Stalls inside one request are therefore smoothed out: an upper bound.

Every float is rounded to 6 decimals and keys are sorted, so one seed gives one byte-identical
JSON document.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from fleetwarden.api.enums import Tier
from fleetwarden.sim.censoring import censored_quantiles
from fleetwarden.sim.instance import Job

PERCENTILES = (50, 95, 99)
CDF_POINTS = 51
"""Quantiles kept per tier for CDF plots (0%, 2%, ..., 100%)."""
FLUIDITY_BINS = 11
"""Fluidity histogram: [0, 0.1), [0.1, 0.2), ..., [0.9, 1.0), then exactly 1.0."""


def even_fluidity(ttft_s: float, gap_s: float, tokens: int, ttft_d: float, tbt_d: float) -> float:
    """Etalon's fluidity-index of a request whose `tokens` output tokens came `ttft_s` after its
    arrival, then every `gap_s`: Algorithm 1 in closed form (O(1) instead of O(tokens))."""
    met = missed = 0
    slack = 0.0
    if ttft_s <= ttft_d:
        met, slack = 1, ttft_d - ttft_s
    else:
        missed = int((ttft_s - ttft_d) // tbt_d) + 1
    rest = tokens - 1
    over = gap_s - tbt_d
    if rest > 0 and over <= 0:
        met += rest
    elif rest > 0:
        ahead = min(rest, int(slack // over))  # tokens the carried slack still covers
        met += ahead
        rest -= ahead
        if rest > 0:
            missed += int((over - (slack - ahead * over)) // tbt_d) + 1
            missed += (rest - 1) * (int(over // tbt_d) + 1)
    return met / (met + missed)


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        rounded = round(value, 6)
        return 0.0 if rounded == 0 else rounded
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


@dataclass
class TierStats:
    requests: int = 0
    first_token: int = 0
    completed: int = 0
    throttled: int = 0
    rejected: int = 0
    within_target: int = 0
    ttft_target_s: float | None = None
    ttft_s: dict[str, float] = field(default_factory=dict)
    e2e_s: dict[str, float] = field(default_factory=dict)
    attainment: float | None = None
    attainment_served: float | None = None
    ttft_cdf_s: list[float] = field(default_factory=list)
    pending: int = 0
    """Still in the fleet at the end: queued or running on an instance, waiting for an instance
    in its region, or queued for a NIW release (counted where it waits, `sim.summary`)."""
    pending_started: int = 0
    """Of `pending`, those whose first token came within the run."""
    ttft_covers: str = "served"
    """Which requests `ttft_s` and `ttft_cdf_s` cover: "served" (those that got a first token;
    the fluid fidelity) or "admitted" (those plus the ones still waiting at the end, censored at
    their wait so far)."""
    ttft_lower_bound: list[str] = field(default_factory=list)
    """Percentiles of `ttft_s` that a censored wait reaches: lower bounds of the true value."""
    ttft_served_s: dict[str, float] = field(default_factory=dict)
    """TTFT percentiles over requests that got a first token only."""
    fluidity_hist: list[int] = field(default_factory=list)
    """Completed requests per fluidity bin (`FLUIDITY_BINS`); empty without TBT targets."""
    fluidity_mean: float | None = None


@dataclass
class EndpointStats:
    model: str
    pool: str
    region: str
    gpu_type: str
    instance_hours: float = 0.0
    gpu_hours: float = 0.0
    cost: float = 0.0
    cold_start_gpu_hours: float = 0.0
    donated_instance_hours: float = 0.0
    launches: int = 0
    reclaims: int = 0
    scale_out: int = 0
    scale_in: int = 0
    blocked_scale_out: int = 0
    """+1 decisions the pool had no capacity for."""


@dataclass
class NiwStats:
    items: int = 0
    completed: int = 0
    met_deadline: int = 0
    late: int = 0
    pending: int = 0
    pending_overdue: int = 0
    promoted: int = 0


@dataclass
class TenantStats:
    requests: int = 0
    demand_tokens: int = 0
    served_requests: int = 0
    served_tokens: int = 0
    throttled_requests: int = 0
    throttled_tokens: int = 0
    rejected_requests: int = 0
    served_tokens_by_period: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What happened to one request (kept only on demand: tests and debugging)."""

    seq: int
    model: str
    tenant: str
    tier: str
    home: str
    pool: str
    instance: int
    arrival_s: float
    outcome: str
    """completed, throttled or rejected."""
    dispatch_s: float | None = None
    dispatch_index: int = -1
    """Admission order on its instance."""
    first_token_s: float | None = None
    completion_s: float | None = None
    spilled: bool = False


def _first_token_s(job: Job) -> float | None:
    """When the job's first token came, or None if it never started (the job keeps NaN)."""
    first_token_s = job.first_token_s
    return None if first_token_s is None or math.isnan(first_token_s) else first_token_s


def outcome(job: Job, what: str, completion_s: float | None = None) -> RequestOutcome:
    return RequestOutcome(
        seq=job.request.seq,
        model=job.model,
        tenant=job.tenant,
        tier=job.tier.value,
        home=job.home,
        pool=job.pool,
        instance=job.instance,
        arrival_s=job.arrival_s,
        outcome=what,
        dispatch_s=None if math.isnan(job.dispatch_s) else job.dispatch_s,
        dispatch_index=job.dispatch_index,
        first_token_s=_first_token_s(job),
        completion_s=completion_s,
        spilled=job.spilled,
    )


@dataclass
class SimResults:
    """Everything one run measured (see the module docstring for the definitions)."""

    meta: dict[str, Any]
    totals: dict[str, Any]
    endpoints: dict[str, EndpointStats]
    tiers: dict[str, TierStats]
    niw: NiwStats
    tenants: dict[str, TenantStats]
    series: dict[str, Any]
    jain_index: float | None
    requests: list[RequestOutcome] | None = None
    """One record per finished request, in completion order (only with `keep_requests`)."""

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "meta": self.meta,
            "totals": self.totals,
            "endpoints": {k: asdict(v) for k, v in self.endpoints.items()},
            "tiers": {k: asdict(v) for k, v in self.tiers.items()},
            "niw": asdict(self.niw),
            "tenants": {k: asdict(v) for k, v in self.tenants.items()},
            "series": self.series,
            "jainIndex": self.jain_index,
        }
        if self.requests is not None:
            body["requests"] = [asdict(r) for r in self.requests]
        cleaned: dict[str, Any] = _clean(body)
        return cleaned

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")) + "\n"


class Recorder:
    """Collects per-request outcomes while the simulation runs."""

    def __init__(
        self,
        ttft_targets: Mapping[str, Mapping[Tier, float]],
        tenant_period_s: float,
        *,
        keep_requests: bool = False,
        tbt_targets: Mapping[str, Mapping[Tier, float]] | None = None,
    ) -> None:
        self._targets = ttft_targets
        self._tbt = tbt_targets
        """Per model key: TBT target per interactive tier (None: no fluidity-index)."""
        self._goals: dict[str, dict[Tier, tuple[float, float | None]]] = {
            model: {
                tier: (target, None if tbt_targets is None else tbt_targets[model].get(tier))
                for tier, target in targets.items()
                if target is not None
            }
            for model, targets in ttft_targets.items()
        }
        """Per model key and tier with a TTFT target: (TTFT target, TBT target or None), the two
        looked up at once (`completed` runs for every request)."""
        self._fluidity: dict[Tier, list[int]] = {t: [0] * FLUIDITY_BINS for t in Tier}
        self._fluidity_sum: dict[Tier, float] = {t: 0.0 for t in Tier}
        self.requests: list[RequestOutcome] | None = [] if keep_requests else None
        """Per model key: TTFT target per interactive tier."""
        self.tenant_period_s = tenant_period_s
        self.tiers: dict[Tier, TierStats] = {t: TierStats() for t in Tier}
        self._ttft: dict[Tier, array[float]] = {t: array("d") for t in Tier}
        self._censored: dict[Tier, array[float]] = {t: array("d") for t in Tier}
        """Waits so far (end - arrival) of requests with no first token at the end."""
        self._e2e: dict[Tier, array[float]] = {t: array("d") for t in Tier}
        self.tenants: dict[str, TenantStats] = {}
        self.niw = NiwStats()
        self.spilled = 0
        self.abandoned = 0

    def _tenant(self, name: str) -> TenantStats:
        stats = self.tenants.get(name)
        if stats is None:
            stats = self.tenants[name] = TenantStats()
        return stats

    def arrived(self, job: Job) -> None:
        self.tiers[job.tier].requests += 1
        tenant = self.tenants.get(job.tenant) or self._tenant(job.tenant)
        tenant.requests += 1
        tenant.demand_tokens += job.tokens
        if job.tier is Tier.NIW:
            self.niw.items += 1

    def throttled(self, job: Job) -> None:
        if self.requests is not None:
            self.requests.append(outcome(job, "throttled"))
        self.tiers[job.tier].throttled += 1
        tenant = self._tenant(job.tenant)
        tenant.throttled_requests += 1
        tenant.throttled_tokens += job.tokens

    def rejected(self, job: Job) -> None:
        if self.requests is not None:
            self.requests.append(outcome(job, "rejected"))
        self.tiers[job.tier].rejected += 1
        self._tenant(job.tenant).rejected_requests += 1

    def completed(self, job: Job, now: float) -> None:
        if self.requests is not None:
            self.requests.append(outcome(job, "completed", now))
        tier = job.tier
        stats = self.tiers[tier]
        stats.first_token += 1
        stats.completed += 1
        arrival_s = job.arrival_s
        first_token_s = job.first_token_s
        assert first_token_s is not None  # a job's is NaN until it starts, never None
        ttft = first_token_s - arrival_s
        self._ttft[tier].append(ttft)
        self._e2e[tier].append(now - arrival_s)
        goals = self._goals[job.model].get(tier)
        if goals is not None:
            target, tbt = goals
            if ttft <= target:
                stats.within_target += 1
            if tbt is not None:  # `_fluid`, inlined: this runs for every request
                tokens = job.request.max_output_tokens
                if tokens < 1:
                    tokens = 1
                gap = (now - first_token_s) / (tokens - 1) if tokens > 1 else 0.0
                index = even_fluidity(ttft, gap, tokens, target, tbt)
                self._fluidity[tier][min(FLUIDITY_BINS - 1, int(index * (FLUIDITY_BINS - 1)))] += 1
                self._fluidity_sum[tier] += index
        tenant = self.tenants.get(job.tenant) or self._tenant(job.tenant)
        tenant.served_requests += 1
        tenant.served_tokens += job.tokens
        period = int(now // self.tenant_period_s)
        served = tenant.served_tokens_by_period
        if period >= len(served):
            served.extend([0] * (period + 1 - len(served)))
        served[period] += job.tokens
        if job.spilled:
            self.spilled += 1
        if job.niw_deadline_s is not None:
            self.niw.completed += 1
            if now <= job.niw_deadline_s:
                self.niw.met_deadline += 1
            else:
                self.niw.late += 1

    def started_only(self, job: Job) -> None:
        """A request that got its first token but had not finished when the run ended."""
        stats = self.tiers[job.tier]
        stats.first_token += 1
        first_token_s = job.first_token_s
        assert first_token_s is not None  # a job's is NaN until it starts, never None
        ttft = first_token_s - job.arrival_s
        self._ttft[job.tier].append(ttft)
        target = self._targets[job.model].get(job.tier)
        if target is not None and ttft <= target:
            stats.within_target += 1

    def unfinished(self, job: Job, end: float) -> None:
        """A request still in the fleet when the run ended (queued, running, or waiting for an
        instance or a NIW release): pending; its TTFT if its first token came by `end`, else its
        wait so far, censored."""
        stats = self.tiers[job.tier]
        stats.pending += 1
        first_token_s = _first_token_s(job)
        if first_token_s is not None and first_token_s <= end:
            stats.pending_started += 1
            self.started_only(job)
        else:
            self._censored[job.tier].append(end - job.arrival_s)
        if job.niw_deadline_s is not None:
            self.pending_niw(job, end)

    def pending_niw(self, job: Job, end: float) -> None:
        self.niw.pending += 1
        if job.niw_deadline_s is not None and job.niw_deadline_s < end:
            self.niw.pending_overdue += 1

    def tier_results(self, targets: Mapping[Tier, float | None]) -> dict[str, TierStats]:
        out: dict[str, TierStats] = {}
        for tier, stats in self.tiers.items():
            stats.ttft_target_s = targets.get(tier)
            ttft = np.frombuffer(self._ttft[tier], dtype=np.float64)
            censored = np.frombuffer(self._censored[tier], dtype=np.float64)
            e2e = np.frombuffer(self._e2e[tier], dtype=np.float64)
            stats.ttft_covers = "admitted"
            if ttft.size:
                stats.ttft_served_s = {f"p{p}": float(np.percentile(ttft, p)) for p in PERCENTILES}
            if ttft.size or censored.size:
                quantiles = censored_quantiles(ttft, censored, [p / 100 for p in PERCENTILES])
                stats.ttft_s = {
                    f"p{p}": q.value for p, q in zip(PERCENTILES, quantiles, strict=True)
                }
                stats.ttft_lower_bound = [
                    f"p{p}" for p, q in zip(PERCENTILES, quantiles, strict=True) if q.lower_bound
                ]
                cdf = censored_quantiles(ttft, censored, list(np.linspace(0, 1, CDF_POINTS)))
                stats.ttft_cdf_s = [q.value for q in cdf]
            if e2e.size:
                stats.e2e_s = {f"p{p}": float(np.percentile(e2e, p)) for p in PERCENTILES}
            fluid = sum(self._fluidity[tier])
            if self._tbt is not None and fluid:
                stats.fluidity_hist = list(self._fluidity[tier])
                stats.fluidity_mean = self._fluidity_sum[tier] / fluid
            if tier is not Tier.NIW and stats.requests:
                stats.attainment = stats.within_target / stats.requests
            if tier is not Tier.NIW and stats.first_token:
                stats.attainment_served = stats.within_target / stats.first_token
            out[tier.value] = stats
        return out

    def jain_index(self) -> float | None:
        ratios = [
            t.served_tokens / t.demand_tokens for t in self.tenants.values() if t.demand_tokens
        ]
        if not ratios or not any(ratios):
            return None
        # Named float totals: mypyc mis-types `sum(floats) ** 2` (a `float | Literal[0]` union).
        total: float = sum(ratios)
        squares: float = sum(r * r for r in ratios)
        return total**2 / (len(ratios) * squares)
