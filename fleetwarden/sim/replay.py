"""Replay a trace through one engine instance under one scheduling policy.

The driver owns simulated time and follows the engine model's rules exactly: arrivals are pushed
into the policy (after the optional throttle), admissions happen when the engine allows them,
the policy's head is dispatched while the staggered memory check and the prefill cap allow, and
every generated token is charged to the policy as it is produced. The dispatch order and one
record per request are the result; metrics are computed from them in `fairness_metrics`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fleetwarden.fairness.request import Request, SchedulingPolicy
from fleetwarden.sim.engine import EngineModel, EngineProfile
from fleetwarden.sim.trace import TraceRequest

Throttle = Callable[[Request, float, EngineModel], bool]
"""Returns True when an arriving request must be refused (HTTP 429 in the sidecar)."""


@dataclass
class RequestRecord:
    """What happened to one request."""

    trace: TraceRequest
    seq: int
    throttled: bool = False
    """Refused on arrival (HTTP 429)."""
    abandoned: bool = False
    """Never sent: an earlier call of its interaction was refused, so the client gave up on it."""
    rejected: bool = False
    dispatch_s: float | None = None
    first_token_s: float | None = None
    completion_s: float | None = None
    output_tokens: int = 0

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_s is None:
            return None
        return self.first_token_s - self.trace.arrival_s


@dataclass
class ReplayResult:
    profile: EngineProfile
    records: list[RequestRecord]
    dispatch_order: list[int] = field(default_factory=list)
    """`seq` of each request in the order the policy dispatched them."""
    end_s: float = 0.0


def to_request(seq: int, trace: TraceRequest, predicted: int | None = None) -> Request:
    return Request(
        seq=seq,
        tenant=trace.tenant,
        arrival_s=trace.arrival_s,
        input_tokens=trace.input_tokens,
        max_output_tokens=trace.output_tokens,
        system_tokens=trace.system_tokens,
        app=trace.app,
        interaction=trace.interaction,
        stage=trace.stage,
        tier=trace.tier,
        deadline_s=None if trace.deadline_s is None else trace.arrival_s + trace.deadline_s,
        predicted_output_tokens=predicted,
    )


def replay(
    trace: Sequence[TraceRequest],
    policy: SchedulingPolicy,
    profile: EngineProfile,
    *,
    throttle: Throttle | None = None,
    predictions: Sequence[int | None] | None = None,
    max_time_s: float = float("inf"),
    observe: Callable[[float], None] | None = None,
    on_complete: Callable[[Request], None] | None = None,
) -> ReplayResult:
    """Run `trace` (in arrival order) to completion, or until `max_time_s` of simulated time."""
    engine = EngineModel(profile)
    records = [RequestRecord(t, i) for i, t in enumerate(trace)]
    result = ReplayResult(profile, records)
    requests: dict[int, Request] = {}
    now, next_arrival = 0.0, 0
    interactions: set[tuple[str, str]] = set()
    """Interactions with an admitted call: later calls continue them (FairServe)."""
    broken: set[tuple[str, str]] = set()
    """Interactions with a refused call: their later calls are never sent."""

    def finish_tokens(running: Sequence[Request], at: float) -> None:
        for request in running:
            policy.charge(request, output_tokens=1, now=at)
            request.output_tokens += 1
        for done in engine.finished():
            record = records[done.request.seq]
            record.completion_s = at
            record.output_tokens = done.request.output_tokens
            policy.complete(done.request, at)
            if on_complete is not None:
                on_complete(done.request)

    while now <= max_time_s:
        while next_arrival < len(trace) and trace[next_arrival].arrival_s <= now:
            item = trace[next_arrival]
            predicted = predictions[next_arrival] if predictions is not None else None
            request = to_request(next_arrival, item, predicted)
            key = (item.tenant, item.interaction) if item.interaction is not None else None
            request.continuation = key is not None and key in interactions
            if key is not None and key in broken:
                records[next_arrival].abandoned = True
            elif throttle is not None and throttle(request, item.arrival_s, engine):
                records[next_arrival].throttled = True
                if key is not None:
                    broken.add(key)
            else:
                if key is not None:
                    interactions.add(key)
                requests[request.seq] = request
                policy.push(request, item.arrival_s)
            next_arrival += 1

        if engine.may_admit():
            batch: list[Request] = []
            prompt_tokens = 0
            while (head := policy.peek(now)) is not None:
                over_cap = batch and prompt_tokens + head.input_tokens > profile.prefill_cap_tokens
                if over_cap or not engine.fits([*batch, head]):
                    break
                popped = policy.pop(now)
                assert popped is head, "a policy must dispatch exactly the head it showed"
                batch.append(head)
                prompt_tokens += head.input_tokens
                result.dispatch_order.append(head.seq)
                records[head.seq].dispatch_s = now
            if batch:
                now += engine.prefill(batch, now, [r.max_output_tokens for r in batch])
                for request in batch:
                    records[request.seq].first_token_s = now
                finish_tokens(batch, now)

        if not engine.idle:
            now += engine.decode_seconds()
            finish_tokens([r.request for r in engine.running], now)
            engine.after_decode_step()
            if observe is not None:
                observe(now)
            continue

        if len(policy):
            # Idle engine, queued work, nothing fits: the head is larger than the whole KV budget.
            head = policy.peek(now)
            if head is not None and policy.remove(head):
                records[head.seq].rejected = True
            continue
        if next_arrival >= len(trace):
            break
        now = max(now, trace[next_arrival].arrival_s)
    for running in engine.running:
        records[running.request.seq].output_tokens = running.request.output_tokens
    result.end_s = now
    return result
