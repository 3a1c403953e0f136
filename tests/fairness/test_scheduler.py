"""FairScheduler: the composition the sidecar runs (admission, queue bounds, gate, settlement)."""

from __future__ import annotations

from fleetwarden.api.enums import PolicyName
from fleetwarden.fairness.config import ApplicationConfig, FairnessConfig, GateConfig, TenantConfig
from fleetwarden.fairness.gate import EngineTelemetry
from fleetwarden.fairness.limits import ThrottleReason
from fleetwarden.fairness.render import standalone_config
from fleetwarden.fairness.request import Request
from fleetwarden.fairness.scheduler import FairScheduler, QueueLimits, Refusal


def config(**changes: object) -> FairnessConfig:
    base = standalone_config("m")
    return FairnessConfig.model_validate({**base.model_dump(), **changes})


def req(seq: int, tenant: str, tokens: int = 100, out: int = 100) -> Request:
    return Request(
        seq=seq, tenant=tenant, arrival_s=0.0, input_tokens=tokens, max_output_tokens=out
    )


def test_queue_bounds_refuse_without_side_effects() -> None:
    s = FairScheduler(config(), queue_limits=QueueLimits(per_tenant=2, total=3))
    s.observe_engine(EngineTelemetry(0.0, 0, 0.0))
    # With nothing in flight the gate admits one; block it so the rest queue.
    assert s.offer(req(0, "a"), 0.0).queued
    assert s.dispatch(0.0) is not None
    s.gate.max_inflight_tokens = 1
    assert s.offer(req(1, "a"), 0.0).queued
    assert s.offer(req(2, "a"), 0.0).queued
    third = s.offer(req(3, "a"), 0.0)
    assert (third.queued, third.refusal) == (False, Refusal.TENANT_QUEUE_FULL)
    assert s.offer(req(4, "b"), 0.0).queued
    full = s.offer(req(5, "c"), 0.0)
    assert (full.queued, full.refusal) == (False, Refusal.QUEUE_FULL)
    assert full.retry_after_s > 0
    assert s.queued == 3


def test_rate_limited_requests_do_not_use_quota() -> None:
    cfg = config(defaults=TenantConfig(weight=1, tier="iw-n", priority_factor=1, rpm=2))
    s = FairScheduler(cfg)
    assert s.offer(req(0, "a"), 0.0).queued
    assert s.offer(req(1, "a"), 1.0).queued
    refused = s.offer(req(2, "a"), 2.0)
    assert refused.refusal is Refusal.RATE_LIMITED
    assert refused.detail == "tenant-rpm"
    assert 57.0 < refused.retry_after_s <= 58.0  # the first request leaves the window at t=60
    # Retrying while throttled must not extend the block: at t=60.5 one slot is free again.
    for t in range(3, 60):
        assert not s.offer(req(100 + t, "a"), float(t)).queued
    assert s.offer(req(3, "a"), 60.5).queued


def test_gate_holds_until_telemetry_and_budget_allow() -> None:
    cfg = config(
        gate=GateConfig(max_inflight_tokens=300, max_waiting_requests=0, telemetry_max_age_s=5)
    )
    s = FairScheduler(cfg)
    for seq in range(3):
        s.offer(req(seq, "a"), 0.0)
    first = s.dispatch(0.0)
    assert first is not None
    assert first.seq == 0
    assert s.dispatch(0.0) is None  # no telemetry yet: saturated
    s.observe_engine(EngineTelemetry(0.0, 0, 0.1))
    assert s.dispatch(0.0) is None  # 200 + 200 tokens at peak exceed the 300 budget
    s.finish(first, 1.0)
    assert [r.seq for r in s.dispatch_ready(1.0)] == [1]
    s.observe_engine(EngineTelemetry(2.0, 3, 0.1))  # the engine has its own queue now
    s.gate.max_inflight_tokens = None
    assert s.dispatch(2.0) is None
    s.observe_engine(EngineTelemetry(2.5, 0, 0.1))
    assert s.dispatch(2.5) is not None
    assert s.dispatch(20.0) is None  # nothing queued


def test_vtc_settles_estimates_with_exact_usage() -> None:
    s = FairScheduler(config(policy=PolicyName.VTC))
    r = req(0, "a", tokens=100, out=50)
    s.offer(r, 0.0)
    assert s.dispatch(0.0) is r
    counters = s.policy.counters  # type: ignore[attr-defined]
    assert counters["a"] == 100  # input charged at dispatch with w_p = 1
    s.on_output(r, 10, 0.5)
    assert counters["a"] == 120  # w_q = 2
    s.reconcile_input(r, 90, 1.0)
    s.reconcile_output(r, 12, 1.0)
    assert counters["a"] == 90 + 2 * 12
    s.finish(r, 1.0)
    assert s.running == 0


def test_cancel_queued_and_running() -> None:
    s = FairScheduler(config())
    a, b = req(0, "a"), req(1, "b")
    s.offer(a, 0.0)
    s.offer(b, 0.0)
    assert s.dispatch(0.0) is a
    s.cancel(b, 0.1)
    assert s.queued == 0
    assert not s.is_queued(b)
    s.cancel(a, 0.2)
    assert s.running == 0
    s.cancel(a, 0.3)  # twice is harmless


def test_reconfigure_keeps_queue_in_arrival_order_and_inflight_accounting() -> None:
    s = FairScheduler(config(policy=PolicyName.FCFS))
    s.observe_engine(EngineTelemetry(0.0, 0, 0.0))
    for seq, tenant in enumerate(["a", "a", "b", "a"]):
        s.offer(req(seq, tenant), 0.0)
    running = s.dispatch(0.0)
    assert running is not None
    s.gate.max_inflight_tokens = 1
    new = config(
        policy=PolicyName.VTC,
        gate=GateConfig(max_inflight_tokens=1, max_waiting_requests=0, telemetry_max_age_s=5),
    )
    assert s.reconfigure(new, 1.0)
    assert not s.reconfigure(new, 1.0)  # same version: nothing to do
    assert s.queued == 3
    assert s.running == 1
    assert s.dispatch(1.0) is None  # the in-flight request still counts against the new gate
    s.on_output(running, 5, 1.5)  # settles with the policy that dispatched it
    s.finish(running, 2.0)
    order = []
    while (r := s.dispatch(3.0)) is not None:
        order.append(r.seq)
        s.finish(r, 3.0)
    # VTC alternates: b (counter 0 after lift) is not starved behind a's queue.
    assert sorted(order) == [1, 2, 3]
    assert order.index(2) <= 1


def test_oit_throttles_only_under_overload_and_never_continuations() -> None:
    cfg = config(
        policy=PolicyName.WSC,
        interaction_throttling=True,
        defaults=TenantConfig(weight=1, tier="iw-n", priority_factor=1, rpm=1),
    )
    s = FairScheduler(cfg)
    s.observe_engine(EngineTelemetry(0.0, 0, 0.2))
    assert s.offer(req(0, "a"), 0.0).queued
    assert s.offer(req(1, "a"), 0.1).queued  # over the RPM limit, but the engine is not overloaded
    s.observe_engine(EngineTelemetry(0.2, 0, 0.95))
    assert s.overloaded(0.2)
    assert s.offer(req(2, "a"), 0.3).refusal is Refusal.RATE_LIMITED
    continuation = req(3, "a")
    continuation.continuation = True
    assert s.offer(continuation, 0.4).queued


def test_output_tokens_count_toward_tpm_windows_only_when_a_tpm_limit_exists() -> None:
    limited = FairScheduler(
        config(defaults=TenantConfig(weight=1, tier="iw-n", priority_factor=1, tpm=10_000))
    )
    unlimited = FairScheduler(config())
    for s in (limited, unlimited):
        r = req(0, "a", tokens=100)
        s.offer(r, 0.0)
        assert s.dispatch(0.0) is r
        s.on_output(r, 40, 1.0)
    assert limited.limiter.usage("a", None, 1.0)[ThrottleReason.TENANT_TPM] == 140
    assert unlimited.limiter.usage("a", None, 1.0) == {}


def test_throughput_estimate_counts_every_token_of_closely_spaced_events() -> None:
    """Token events 100 us apart (a busy sidecar) are batched into one observation per
    THROUGHPUT_SAMPLE_S; none is lost, so the estimate is the delivered rate."""
    s = FairScheduler(config())
    s.observe_engine(EngineTelemetry(0.0, 0, 0.0))
    running = req(0, "a", out=1_000_000)
    assert s.offer(running, 0.0).queued
    assert s.dispatch(0.0) is running
    for step in range(1, 80_001):  # 8 s at 3 tokens per 100 us: 30,000 tokens/s
        s.on_output(running, 3, step * 1e-4)
    rate = s.throughput.rate(8.0)
    assert rate is not None
    assert abs(rate - 30_000) < 300, rate


def test_oit_records_admitted_requests_idle_time_and_continuations_alike() -> None:
    """OIT's other rules hold after the change: arrivals let through while idle count, so the
    window is full when overload begins; a continuation still passes a full window."""
    cfg = config(
        interaction_throttling=True,
        defaults=TenantConfig(weight=1, tier="iw-n", priority_factor=1, rpm=2),
    )
    s = FairScheduler(cfg)
    s.observe_engine(EngineTelemetry(0.0, 0, 0.2))
    assert s.offer(req(0, "a"), 0.0).queued
    assert s.offer(req(1, "a"), 0.1).queued
    assert s.offer(req(2, "a"), 0.2).queued  # idle engine: over the limit, still served
    assert s.limiter.usage("a", None, 0.2) == {ThrottleReason.TENANT_RPM: 3}
    s.observe_engine(EngineTelemetry(0.3, 0, 0.95))
    assert s.offer(req(3, "a"), 0.3).refusal is Refusal.RATE_LIMITED
    assert s.limiter.usage("a", None, 0.3) == {ThrottleReason.TENANT_RPM: 3}
    continuation = req(4, "a")
    continuation.continuation = True
    assert s.offer(continuation, 0.4).queued
    assert s.limiter.usage("a", None, 0.4) == {ThrottleReason.TENANT_RPM: 4}


def test_a_prompt_over_a_whole_tpm_limit_is_refused_as_never_fitting() -> None:
    """Waiting cannot help a request whose own cost exceeds an always-enforced TPM limit: it is
    refused as not retryable (the sidecar's 400), naming the limit, and records nothing."""
    cfg = config(defaults=TenantConfig(weight=1, tier="iw-n", priority_factor=1, tpm=1000))
    s = FairScheduler(cfg)
    refused = s.offer(req(0, "a", tokens=5000), 0.0)
    assert (refused.queued, refused.refusal, refused.detail) == (
        False,
        Refusal.REQUEST_EXCEEDS_TPM_LIMIT,
        "tenant-tpm",
    )
    assert refused.limit == 1000
    assert not Refusal.REQUEST_EXCEEDS_TPM_LIMIT.retryable
    assert all(r.retryable for r in Refusal if r is not Refusal.REQUEST_EXCEEDS_TPM_LIMIT)
    assert s.limiter.usage("a", None, 0.0) == {ThrottleReason.TENANT_TPM: 0}
    # A prompt that fits the limit but not the window's room now is an ordinary 429.
    assert s.offer(req(1, "a", tokens=900), 0.0).queued
    later = s.offer(req(2, "a", tokens=900), 1.0)
    assert later.refusal is Refusal.RATE_LIMITED
    assert later.retry_after_s == 59.0


def test_an_application_tpm_limit_a_prompt_exceeds_is_named() -> None:
    s = FairScheduler(config(applications={"bot": ApplicationConfig(tpm=100)}))
    r = req(0, "a", tokens=500)
    r.app = "bot"
    refused = s.offer(r, 0.0)
    assert (refused.refusal, refused.detail, refused.limit) == (
        Refusal.REQUEST_EXCEEDS_TPM_LIMIT,
        "app-tpm",
        100,
    )


def test_under_oit_a_prompt_over_a_whole_tpm_limit_stays_retryable() -> None:
    """OIT enforces limits only under overload, so the same request passes once it ends."""
    cfg = config(
        interaction_throttling=True,
        defaults=TenantConfig(weight=1, tier="iw-n", priority_factor=1, tpm=1000),
    )
    s = FairScheduler(cfg)
    s.observe_engine(EngineTelemetry(0.0, 0, 0.95))
    assert s.offer(req(0, "a", tokens=5000), 0.0).refusal is Refusal.RATE_LIMITED
    s.observe_engine(EngineTelemetry(1.0, 0, 0.2))
    assert s.offer(req(1, "a", tokens=5000), 1.0).queued
