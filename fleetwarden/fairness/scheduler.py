"""One sidecar's scheduling brain: admission, queueing, dispatch and accounting, composed.

The policies, limiters, gate and early rejection are separate classes so each can be tested on
its own; a shell needs them wired together in one consistent order. This class is that wiring,
and the sidecar is only its I/O: an arriving request is `offer`ed (queue bounds, then rate limits
or OIT, then early rejection; refused requests change nothing), `dispatch` hands out heads while
the capacity gate admits them, and the token events of running requests flow back through
`on_output`, `reconcile_input` and `finish`. Like every core, it takes `now` as an argument and
does no I/O, so the replay tests and the parity test can drive the exact object production runs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from enum import StrEnum
from heapq import nsmallest
from typing import Any

from fleetwarden.api.enums import LengthPrediction
from fleetwarden.fairness.admission import EarlyRejection, ahead_options
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.drain import ThroughputEstimate
from fleetwarden.fairness.factory import build_policy
from fleetwarden.fairness.gate import CapacityGate, EngineTelemetry
from fleetwarden.fairness.idle import IdleTenants, TenantRetention
from fleetwarden.fairness.limits import (
    OverloadInteractionThrottle,
    RateLimiter,
    ThrottleReason,
    is_overloaded,
)
from fleetwarden.fairness.prediction import MovingAverage
from fleetwarden.fairness.request import Request, SchedulingPolicy


class Refusal(StrEnum):
    """Why an arriving request was refused instead of being queued: 429 (retry later), except
    `REQUEST_EXCEEDS_TPM_LIMIT`, which no retry can pass (see `retryable`)."""

    QUEUE_FULL = "queue-full"
    TENANT_QUEUE_FULL = "tenant-queue-full"
    RATE_LIMITED = "rate-limited"
    EARLY_REJECTION = "early-rejection"
    REQUEST_EXCEEDS_TPM_LIMIT = "request-exceeds-tpm-limit"

    @property
    def retryable(self) -> bool:
        """Whether the same request can pass later. A prompt larger than a whole TPM limit that
        is always enforced never fits the window, however long the client waits."""
        return self is not Refusal.REQUEST_EXCEEDS_TPM_LIMIT


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer to `offer`: queued, or refused with a reason and a hint for Retry-After."""

    queued: bool
    refusal: Refusal | None = None
    detail: str = ""
    """Which limit refused it (e.g. `tenant-rpm`), for the error message and metrics."""
    retry_after_s: float = 0.0
    limit: int | None = None
    """For `REQUEST_EXCEEDS_TPM_LIMIT`: the limit (tokens per window) the request exceeds."""


QUEUED = Admission(True)
SNAPSHOT_TENANTS = 1000
"""Tenants `FairScheduler.snapshot` lists by default (the busiest queues)."""
THROUGHPUT_SAMPLE_S = 0.01
"""Output tokens delivered within this span make one observation of the engine's throughput."""


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """Bounds on waiting requests, so a flood costs a 429, not the sidecar's memory."""

    per_tenant: int = 1024
    total: int = 16384
    retry_after_s: float = 1.0
    """Retry-After hint for a full queue: about one dispatch round."""

    def __post_init__(self) -> None:
        if self.per_tenant < 1 or self.total < 1:
            raise ValueError("queue limits must be >= 1")


def _gate_of(config: FairnessConfig) -> CapacityGate:
    gate = config.gate
    return CapacityGate(
        gate.max_inflight_tokens,
        max_waiting_requests=gate.max_waiting_requests,
        telemetry_max_age_s=gate.telemetry_max_age_s,
    )


@dataclass(frozen=True, slots=True)
class _Installed:
    """Everything one config installs, built before any of it replaces the running parts."""

    config: FairnessConfig
    version: str
    predictor: MovingAverage | None
    policy: SchedulingPolicy
    forget: Callable[[str], None] | None
    """The policy's `forget`, for those that keep state per tenant (VTC, WSC)."""
    limiter: RateLimiter
    counts_output_tokens: bool
    oit: OverloadInteractionThrottle
    gate: CapacityGate
    early: EarlyRejection


def _build(config: FairnessConfig, version: str, drain: ThroughputEstimate) -> _Installed:
    """The parts `config` asks for, fresh: no request queued or running in them yet."""
    predictor = (
        MovingAverage() if config.length_prediction is LengthPrediction.MOVING_AVERAGE else None
    )
    policy = build_policy(config, predictor=predictor)
    limiter = RateLimiter.from_config(config)
    counts_output_tokens = (
        config.defaults.tpm is not None
        or any(t.tpm is not None for t in config.tenants.values())
        or any(a.tpm is not None for a in config.applications.values())
    )
    early = EarlyRejection(
        {tier: target.ttft_s for tier, target in config.tiers.items()},
        drain,
        **ahead_options(config, policy),
    )
    return _Installed(
        config=config,
        version=version,
        predictor=predictor,
        policy=policy,
        forget=getattr(policy, "forget", None),
        limiter=limiter,
        counts_output_tokens=counts_output_tokens,
        oit=OverloadInteractionThrottle(limiter),
        gate=_gate_of(config),
        early=early,
    )


class FairScheduler:
    """Admission, fair ordering and the capacity gate for one engine, under one config.

    Requests are tracked from `offer` to `finish`/`cancel`. A new config (`reconfigure`) swaps
    policy, limits and gate atomically: queued requests move to the new policy in arrival order,
    in-flight ones keep settling with the policy that dispatched them and count against the new
    gate. Fairness counters start afresh under a new config, which is the only sound choice when
    weights or the policy itself changed. A tenant with nothing queued or running for
    `retention.forget_after_s` is forgotten by the policy and the length predictor (`idle`), so
    one-off tenants do not accumulate.
    """

    def __init__(
        self,
        config: FairnessConfig,
        *,
        queue_limits: QueueLimits | None = None,
        retention: TenantRetention | None = None,
        now: float = 0.0,
    ) -> None:
        self.queue_limits = queue_limits or QueueLimits()
        self._idle = IdleTenants(retention)
        self.forgotten = 0
        """Tenants forgotten so far (`fairness.idle`)."""
        self.throughput = ThroughputEstimate()
        self._drain = ThroughputEstimate(paused=True)  # early rejection's rate (`admission`)
        self._unobserved_tokens = 0
        self._last_observed_s: float | None = None
        self._queued: dict[int, Request] = {}
        self._queued_by_tenant: Counter[str] = Counter()
        self._running: dict[int, tuple[Request, SchedulingPolicy]] = {}
        self._running_by_tenant: dict[str, int] = {}
        self._install(config, config.version, now, None)

    # -- configuration ---------------------------------------------------------------------------

    def _install(
        self, config: FairnessConfig, version: str, now: float, telemetry: EngineTelemetry | None
    ) -> None:
        """Build everything `config` needs, migrate the queued and running requests into it, and
        only then swap it in. Building touches nothing of the running state, and the swap is
        plain assignments, so an exception anywhere (a bug, a MemoryError, a combination the
        builders refuse) leaves the scheduler exactly as it was: same version, same limits, same
        queue. The hot paths read the swapped-in attributes directly, never through this."""
        built = _build(config, version, self._drain)
        if telemetry is not None:
            built.gate.observe(telemetry)
        for request, _ in self._running.values():
            built.gate.dispatched(request)  # in flight under the old policy, held by the new gate
        for request in sorted(self._queued.values(), key=lambda r: r.seq):
            built.policy.push(request, now)  # policies never mutate a request on push
            built.early.backlog.add(request)
        # The swap: nothing below can raise.
        self.config = built.config
        self.version = built.version
        self._predictor = built.predictor
        self.policy = built.policy
        self._forget = built.forget
        self.limiter = built.limiter
        self._counts_output_tokens = built.counts_output_tokens
        self._oit = built.oit
        self.gate = built.gate
        self._early = built.early

    def reconfigure(self, config: FairnessConfig, now: float) -> bool:
        """Apply a new config atomically; False (and nothing changes) when it is the same one.

        When it raises, nothing changed either: the exception propagates for the shell to report
        and the old config keeps being enforced (`_install`)."""
        version = config.version  # a hash of the whole document: 0.1 s at 10,000 tenants
        if version == self.version:
            return False
        self._install(config, version, now, self.gate.telemetry)
        return True

    # -- arrivals --------------------------------------------------------------------------------

    def overloaded(self, now: float) -> bool:
        """OIT's trigger: KV utilisation at the threshold, the engine's waiting queue over the
        gate's limit, or the gate's token budget full. Telemetry older than the gate's
        `telemetry_max_age_s` at `now` is unknown, which is not overload (`is_overloaded`), so a
        silent /metrics leaves only the local budget, not the last reading forever."""
        gate, telemetry = self.gate, self.gate.telemetry
        kv, waiting = None, 0
        if telemetry is not None and now - telemetry.observed_s <= gate.telemetry_max_age_s:
            kv, waiting = telemetry.kv_utilization, telemetry.waiting_requests
        engine_queue_full = waiting > gate.max_waiting_requests  # the budget last: it costs most
        return is_overloaded(kv, self.config.overload_kv_utilization, engine_queue_full) or (
            gate.full
        )

    def offer(self, request: Request, now: float) -> Admission:
        """Queue `request` or refuse it; a refused request leaves no trace in any window."""
        limits = self.queue_limits
        if len(self._queued) >= limits.total:
            return Admission(False, Refusal.QUEUE_FULL, "queue-full", limits.retry_after_s)
        if self._queued_by_tenant[request.tenant] >= limits.per_tenant:
            return Admission(
                False, Refusal.TENANT_QUEUE_FULL, "tenant-queue-full", limits.retry_after_s
            )
        tokens = request.input_tokens
        if self.config.interaction_throttling:
            decision = self._oit.decide(
                request.tenant,
                request.app,
                tokens,
                now,
                overloaded=self.overloaded(now),
                continuation=request.continuation,
            )
        else:
            decision = self.limiter.check(request.tenant, request.app, tokens, now)
        if not decision.allowed:
            if decision.retry_after_s == math.inf and not self.config.interaction_throttling:
                # Under OIT the same request passes once the overload ends: only plain limits,
                # enforced always, make a prompt over a whole TPM limit a request that never fits.
                exceeded = self._tpm_exceeded(request.tenant, request.app, tokens)
                if exceeded is not None:
                    reason_of, limit = exceeded
                    return Admission(
                        False, Refusal.REQUEST_EXCEEDS_TPM_LIMIT, reason_of, math.inf, limit
                    )
            reason = decision.reason.value if decision.reason is not None else "rate-limit"
            return Admission(False, Refusal.RATE_LIMITED, reason, decision.retry_after_s)
        if self.config.early_rejection and self._early.should_reject(request, now):
            return Admission(False, Refusal.EARLY_REJECTION, "ttft-target", 1.0)
        # Recorded only now, with or without OIT: a request refused by early rejection was never
        # served, and counting it would rate-limit a tenant that was never admitted at all.
        self.limiter.record(request.tenant, request.app, tokens, now)
        idle = self._idle
        idle.busy(request.tenant)
        if now >= idle.next_check_s:
            self._forget_expired(now)
        if self._predictor is not None and request.predicted_output_tokens is None:
            request.predicted_output_tokens = self._predictor.predict(request.tenant)
        self._queued[request.seq] = request
        self._queued_by_tenant[request.tenant] += 1
        self._early.queued(request, now)
        self.policy.push(request, now)
        return QUEUED

    def _tpm_exceeded(self, tenant: str, app: str | None, tokens: int) -> tuple[str, int] | None:
        """The TPM limit `tokens` exceed by themselves, user before application, if any."""
        limiter = self.limiter
        tpm = limiter.tenant_limits(tenant).tpm
        if tpm is not None and tokens > tpm:
            return ThrottleReason.TENANT_TPM.value, tpm
        if app is not None:
            tpm = limiter.app_limits(app).tpm
            if tpm is not None and tokens > tpm:
                return ThrottleReason.APP_TPM.value, tpm
        return None

    # -- dispatch --------------------------------------------------------------------------------

    def dispatch(self, now: float) -> Request | None:
        """The next request to send to the engine now, or None (queue empty or gate closed)."""
        head = self.policy.peek(now)
        if head is None:
            return None
        if not self.gate.admits(head, now):
            self._early.held(now)  # saturated: the queue's drain rate is the engine's capacity
            return None
        popped = self.policy.pop(now)
        assert popped is head, "a policy must dispatch exactly the head it showed"
        self._leave_queue(head)
        self._early.dispatched(head, now)
        self.gate.dispatched(head)
        self._running[head.seq] = (head, self.policy)
        running = self._running_by_tenant
        running[head.tenant] = running.get(head.tenant, 0) + 1
        return head

    def dispatch_ready(self, now: float) -> list[Request]:
        """Every request the gate admits now, in dispatch order."""
        ready: list[Request] = []
        while (request := self.dispatch(now)) is not None:
            ready.append(request)
        return ready

    def _leave_queue(self, request: Request) -> None:
        del self._queued[request.seq]
        left = self._queued_by_tenant[request.tenant] - 1
        if left:
            self._queued_by_tenant[request.tenant] = left
        else:
            del self._queued_by_tenant[request.tenant]
        self._early.backlog.discard(request)

    # -- running requests ------------------------------------------------------------------------

    def on_output(self, request: Request, tokens: int, now: float) -> None:
        """`tokens` more output tokens of a running request were delivered at `now`."""
        entry = self._running.get(request.seq)
        if entry is None or tokens <= 0:
            return
        entry[1].charge(request, output_tokens=tokens, now=now)
        request.output_tokens += tokens
        self._observe_throughput(tokens, now)
        if self._counts_output_tokens:  # only TPM windows count output; skip the lookups else
            self.limiter.record_tokens(request.tenant, request.app, tokens, now)

    def _observe_throughput(self, tokens: int, now: float) -> None:
        # Tokens are batched into one observation per THROUGHPUT_SAMPLE_S: many requests' tokens
        # arrive at one instant (the estimate needs elapsed time > 0), and in the sidecar a token
        # event arrives every few microseconds, where a rate over microseconds is a noisy sample
        # and costs an exponential per event. Batched tokens are observed later, never dropped.
        self._unobserved_tokens += tokens
        last = self._last_observed_s
        if last is None or now - last >= THROUGHPUT_SAMPLE_S:
            self.throughput.observe(self._unobserved_tokens, now)
            self._unobserved_tokens = 0
            self._last_observed_s = now

    def reconcile_input(self, request: Request, actual_input_tokens: int, now: float) -> None:
        """The engine reported the prompt's true size: charge (or refund) the estimate's error."""
        entry = self._running.get(request.seq)
        delta = actual_input_tokens - request.input_tokens
        if entry is None or delta == 0 or actual_input_tokens < 0:
            return
        entry[1].charge(request, input_tokens=delta, now=now)
        request.input_tokens = actual_input_tokens

    def reconcile_output(self, request: Request, actual_output_tokens: int, now: float) -> None:
        """The engine's usage says how many tokens were really generated: settle the difference."""
        delta = actual_output_tokens - request.output_tokens
        if delta > 0:
            self.on_output(request, delta, now)
        elif delta < 0 and (entry := self._running.get(request.seq)) is not None:
            entry[1].charge(request, output_tokens=delta, now=now)
            request.output_tokens = actual_output_tokens

    def finish(self, request: Request, now: float) -> None:
        """A dispatched request is done (completed, failed or cancelled while running)."""
        entry = self._running.pop(request.seq, None)
        if entry is None:
            return
        entry[1].complete(request, now)
        self.gate.finished(request)
        if self._predictor is not None and entry[1] is self.policy:
            self._predictor.observe(request.tenant, request.output_tokens)
        tenant = request.tenant
        left = self._running_by_tenant[tenant] - 1
        if left:
            self._running_by_tenant[tenant] = left
        else:
            del self._running_by_tenant[tenant]
            if tenant not in self._queued_by_tenant:
                self._went_idle(tenant, now)

    def cancel(self, request: Request, now: float) -> None:
        """The client went away: drop a queued request, or settle a running one."""
        if request.seq in self._queued:
            self.policy.remove(request)
            self._leave_queue(request)
            tenant = request.tenant
            if tenant not in self._queued_by_tenant and tenant not in self._running_by_tenant:
                self._went_idle(tenant, now)
        else:
            self.finish(request, now)

    # -- idle tenants ----------------------------------------------------------------------------

    def _went_idle(self, tenant: str, now: float) -> None:
        """The tenant's last queued or running request left at `now`."""
        idle = self._idle
        idle.idle(tenant, now)
        if now >= idle.next_check_s:
            self._forget_expired(now)

    def _forget_expired(self, now: float) -> None:
        """Forget the tenants idle for the retention's time, or beyond its count (`idle`)."""
        for tenant in self._idle.expired(now):
            if self._forget is not None:
                self._forget(tenant)
            if self._predictor is not None:
                self._predictor.forget(tenant)
            self.forgotten += 1

    # -- telemetry and introspection -------------------------------------------------------------

    def observe_engine(self, telemetry: EngineTelemetry) -> None:
        """Fresh engine metrics: the gate's waiting queue and OIT's KV utilisation."""
        self.gate.observe(telemetry)

    @property
    def queued(self) -> int:
        return len(self._queued)

    @property
    def running(self) -> int:
        return len(self._running)

    def is_queued(self, request: Request) -> bool:
        return request.seq in self._queued

    def snapshot(
        self, now: float, *, tenants: Collection[str] = (), limit: int = SNAPSHOT_TENANTS
    ) -> dict[str, Any]:
        """A JSON-ready view for the admin API: queues, counters, limits in use.

        Bounded, because the sidecar builds it on the event loop that relays every token: with
        110,000 tenants known and 10,000 queued, listing them all took 0.25 s plus 0.5 s of JSON
        encoding, a stall of every stream. It lists the `limit` tenants with the most queued
        requests and their counters, plus the counters of `tenants` (those asked for by name),
        and counts the rest (`queuedTenants`, `knownTenants`).
        """
        counters = getattr(self.policy, "counters", None)
        telemetry = self.gate.telemetry
        # Most queued first, ties by name: the listing never depends on arrival order.
        busiest = nsmallest(limit, self._queued_by_tenant.items(), key=lambda kv: (-kv[1], kv[0]))
        shown = sorted(busiest)
        if isinstance(counters, dict):
            named = {t for t in tenants if t in counters} | {t for t, _ in shown if t in counters}
            counter_view: dict[str, float] | None = {
                t: round(counters[t], 3) for t in sorted(named)
            }
        else:
            counter_view = None
        return {
            "version": self.version,
            "policy": self.config.policy.value,
            "ordering": self.config.ordering.value,
            "queued": self.queued,
            "running": self.running,
            "idleTenants": len(self._idle),
            "forgottenTenants": self.forgotten,
            "queuedTenants": len(self._queued_by_tenant),
            "queuedByTenant": dict(shown),
            "knownTenants": len(counters) if isinstance(counters, dict) else None,
            "counters": counter_view,
            "overloaded": self.overloaded(now),
            "gateFull": self.gate.full,
            "engine": None
            if telemetry is None
            else {
                "ageSeconds": round(now - telemetry.observed_s, 3),
                "waitingRequests": telemetry.waiting_requests,
                "kvUtilization": telemetry.kv_utilization,
            },
            "throughputTokensPerSecond": self.throughput.rate(now),
        }


__all__ = [
    "QUEUED",
    "Admission",
    "FairScheduler",
    "QueueLimits",
    "Refusal",
    "ThrottleReason",
]
