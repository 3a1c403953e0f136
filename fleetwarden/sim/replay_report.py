"""`fleetwarden replay`: one engine instance, one policy, one trace, a JSON report.

Policies by name (the issue's list): fcfs, lcf, vtc, vtc-oracle (oracle length prediction),
vtc-predict (moving average of each tenant's last five outputs), wvtc (weights from --weights),
wsc, wsc-oit (WSC with FairServe's overload-aware interaction throttling), drr, and rpm (FCFS
behind a per-tenant requests-per-minute limit, the industry default the papers compare against).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetwarden.fairness.drr import DeficitRoundRobin
from fleetwarden.fairness.fcfs import FirstComeFirstServed
from fleetwarden.fairness.limits import (
    Limits,
    OverloadInteractionThrottle,
    RateLimiter,
    is_overloaded,
)
from fleetwarden.fairness.request import Request, SchedulingPolicy
from fleetwarden.fairness.vtc import LeastCounterFirst, VirtualTokenCounter
from fleetwarden.fairness.wsc import WeightedServiceCounter
from fleetwarden.sim import fairness_metrics as fm
from fleetwarden.sim import predictions
from fleetwarden.sim.engine import EngineModel, EngineProfile
from fleetwarden.sim.input_values import InputValueError, finite_number, read_yaml
from fleetwarden.sim.replay import ReplayResult, Throttle, replay
from fleetwarden.sim.trace import TraceRequest

OVERLOAD_KV_UTILIZATION = 0.90


class ReplayUsageError(ValueError):
    """The command line asks for something that cannot be run (unknown policy, bad weights)."""


@dataclass
class Setup:
    """A policy with what it needs around it for one replay."""

    policy: SchedulingPolicy
    throttle: Throttle | None = None
    predictions: Sequence[int | None] | None = None
    on_complete: Callable[[Request], None] | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Options:
    weights: Mapping[str, float] | None = None
    rpm: int | None = None
    seed: int = 42
    stages: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None
    """WSC stage expectations: app -> stage -> {input, system, output} tokens."""


def _vtc_predict(trace: Sequence[TraceRequest], options: Options) -> Setup:
    average = predictions.MovingAverage(window=5)
    policy = VirtualTokenCounter(predict=lambda r: average.predict(r.tenant))
    return Setup(policy, on_complete=lambda r: average.observe(r.tenant, r.output_tokens))


def _rpm(trace: Sequence[TraceRequest], options: Options) -> Setup:
    if options.rpm is None:
        raise ReplayUsageError("policy rpm needs --rpm N (requests per minute per tenant)")
    limiter = RateLimiter(default=Limits(rpm=options.rpm))

    def throttle(request: Request, now: float, engine: EngineModel) -> bool:
        return not limiter.admit(request.tenant, request.app, request.input_tokens, now).allowed

    return Setup(FirstComeFirstServed(), throttle=throttle)


def _overload_throttle(policy: SchedulingPolicy, limiter: RateLimiter) -> Throttle:
    oit = OverloadInteractionThrottle(limiter)

    def throttle(request: Request, now: float, engine: EngineModel) -> bool:
        budget = engine.profile.kv_budget_tokens
        overloaded = is_overloaded(
            engine.held_tokens() / budget, OVERLOAD_KV_UTILIZATION, gate_full=len(policy) > 0
        )
        decision = oit.check(
            request.tenant,
            request.app,
            request.input_tokens,
            now,
            overloaded=overloaded,
            continuation=request.continuation,
        )
        return not decision.allowed

    return throttle


def _wsc(trace: Sequence[TraceRequest], options: Options) -> Setup:
    return Setup(WeightedServiceCounter(stages=options.stages, weights=options.weights))


def _wsc_oit(trace: Sequence[TraceRequest], options: Options) -> Setup:
    if options.rpm is None:
        raise ReplayUsageError(
            "policy wsc-oit needs --rpm N (the limit OIT applies under overload)"
        )
    setup = _wsc(trace, options)
    setup.throttle = _overload_throttle(setup.policy, RateLimiter(default=Limits(rpm=options.rpm)))
    return setup


BUILDERS: dict[str, Callable[[Sequence[TraceRequest], Options], Setup]] = {
    "fcfs": lambda trace, options: Setup(FirstComeFirstServed()),
    "lcf": lambda trace, options: Setup(LeastCounterFirst()),
    "vtc": lambda trace, options: Setup(VirtualTokenCounter()),
    "vtc-oracle": lambda trace, options: Setup(
        VirtualTokenCounter(predict=lambda r: r.predicted_output_tokens),
        predictions=predictions.oracle(trace),
    ),
    "vtc-predict": _vtc_predict,
    "wvtc": lambda trace, options: Setup(VirtualTokenCounter(weights=dict(options.weights or {}))),
    "rpm": _rpm,
    "wsc": _wsc,
    "wsc-oit": _wsc_oit,
    "drr": lambda trace, options: Setup(DeficitRoundRobin()),
}


def policy_names() -> list[str]:
    return sorted(BUILDERS)


def load_weights(path: Path) -> dict[str, float]:
    """Tenant weights from a YAML or JSON mapping `tenant: weight`.

    Each weight must be a finite number > 0: an infinite weight makes a tenant's virtual counter
    stand still (it would starve everyone else), and YAML's `true` is not a weight."""
    try:
        data = read_yaml(path)
    except InputValueError as exc:
        raise ReplayUsageError(f"--weights {path}: {exc}") from exc
    if not isinstance(data, dict) or not data:
        raise ReplayUsageError(f"--weights {path}: weights are a mapping of tenant to a number > 0")
    weights: dict[str, float] = {}
    for tenant, value in data.items():
        try:
            weights[str(tenant)] = finite_number(value, above=True)
        except InputValueError as exc:
            raise ReplayUsageError(f"--weights {path}: tenant {tenant!r}: weight {exc}") from None
    return weights


def build(name: str, trace: Sequence[TraceRequest], options: Options) -> Setup:
    if name not in BUILDERS:
        raise ReplayUsageError(f"unknown policy {name!r}; choose from {', '.join(policy_names())}")
    if name == "wvtc" and not options.weights:
        raise ReplayUsageError("policy wvtc needs --weights FILE (tenant: weight)")
    return BUILDERS[name](trace, options)


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(
    result: ReplayResult, policy: str, *, warmup_s: float = 30.0, prices: fm.Prices | None = None
) -> dict[str, Any]:
    """The JSON report of one replay (see the module docstring of `fairness_metrics`)."""
    prices = prices or fm.Prices()
    records = result.records
    duration = max(result.end_s, warmup_s + 1.0)
    service = fm.service_between(records, warmup_s, duration, result.end_s, prices)
    width = duration - warmup_s
    tenants: dict[str, Any] = {}
    for tenant in fm.tenants_of(records):
        mine = [r for r in records if r.trace.tenant == tenant]
        ttfts = [r.ttft_s for r in mine if r.ttft_s is not None]
        tenants[tenant] = {
            "requests": len(mine),
            "served": sum(1 for r in mine if r.completion_s is not None),
            "throttled": sum(1 for r in mine if r.throttled),
            "abandoned": sum(1 for r in mine if r.abandoned),
            "rejected": sum(1 for r in mine if r.rejected),
            "service_rate": round(service.get(tenant, 0.0) / width, 3),
            "mean_ttft_s": _mean(ttfts),
        }
    backlogged = fm.backlogged_service_rates(result, warmup_s, duration, prices)
    difference = fm.service_difference(result, duration, warmup_s=warmup_s, prices=prices)
    started = [r for r in records if r.first_token_s is not None]
    tokens = sum(r.trace.input_tokens + r.output_tokens for r in started)
    wasted, throttled_interactions = _throttling_waste(result)
    return {
        "policy": policy,
        "engine": result.profile.name,
        "duration_s": round(result.end_s, 3),
        "requests": len(records),
        "served": sum(1 for r in records if r.completion_s is not None),
        "throttled": sum(1 for r in records if r.throttled),
        "abandoned": sum(1 for r in records if r.abandoned),
        "rejected": sum(1 for r in records if r.rejected),
        "throughput_tokens_per_s": round(tokens / result.end_s, 3) if result.end_s else 0.0,
        "tenants": tenants,
        "jain_backlogged": round(fm.jain_index(list(backlogged.values())), 6),
        "backlogged_tenants": sorted(backlogged),
        "accumulated_service_difference_max": round(
            max(fm.accumulated_difference(result, duration, prices=prices), default=0.0), 3
        ),
        "service_difference": {
            "max": round(difference.max, 3),
            "mean": round(difference.mean, 3),
            "variance": round(difference.variance, 3),
        },
        "wasted_tokens": wasted,
        "throttled_interactions": throttled_interactions,
    }


def _throttling_waste(result: ReplayResult) -> tuple[int, int]:
    """FairServe's waste: tokens spent on calls of interactions that a throttle left unfinished
    (the later calls were never sent, so the work already done for the interaction is lost)."""
    broken = {
        (r.trace.tenant, r.trace.interaction)
        for r in result.records
        if r.throttled and r.trace.interaction is not None
    }
    wasted = sum(
        r.trace.input_tokens + r.output_tokens
        for r in result.records
        if (r.trace.tenant, r.trace.interaction) in broken and r.first_token_s is not None
    )
    return wasted, len(broken)


def run(
    trace: Sequence[TraceRequest],
    policy: str,
    profile: EngineProfile,
    options: Options | None = None,
    *,
    until_s: float = float("inf"),
) -> dict[str, Any]:
    """Replay and summarise; the whole of `fleetwarden replay` but the argument parsing."""
    setup = build(policy, trace, options or Options())
    result = replay(
        trace,
        setup.policy,
        profile,
        throttle=setup.throttle,
        predictions=setup.predictions,
        on_complete=setup.on_complete,
        max_time_s=until_s,
    )
    return summarize(result, policy)


def to_text(report: Mapping[str, Any]) -> str:
    """A short human-readable table of the report."""
    lines = [
        f"policy {report['policy']} on {report['engine']}: {report['served']}/{report['requests']} "
        f"served, {report['throttled']} throttled, {report['throughput_tokens_per_s']} tokens/s",
        f"jain (backlogged) {report['jain_backlogged']}, service difference mean "
        f"{report['service_difference']['mean']} max {report['service_difference']['max']}",
        f"{'tenant':<16}{'requests':>9}{'served':>8}{'throttled':>10}{'service/s':>11}{'ttft_s':>9}",
    ]
    for tenant, row in report["tenants"].items():
        ttft = "-" if row["mean_ttft_s"] is None else f"{row['mean_ttft_s']:.3f}"
        lines.append(
            f"{tenant:<16}{row['requests']:>9}{row['served']:>8}{row['throttled']:>10}"
            f"{row['service_rate']:>11.1f}{ttft:>9}"
        )
    return "\n".join(lines)


def dumps(report: Mapping[str, Any]) -> str:
    return json.dumps(report, sort_keys=True)
