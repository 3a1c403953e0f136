"""The capacity gate (token budget, engine telemetry) and early rejection."""

from __future__ import annotations

import pytest

from fleetwarden.api.enums import Tier
from fleetwarden.fairness.admission import AheadRule, EarlyRejection, ThroughputEstimate
from fleetwarden.fairness.gate import CapacityGate, EngineTelemetry, GateReason
from fleetwarden.fairness.request import Request

# The two tiered rules the shorthand `fair` stood for: DRR's bands, and tiers alone.
RULE_BANDED, RULE_TIERS = AheadRule.BANDED_SHARES, AheadRule.TIERS


def req(seq: int, inp: int = 100, out: int = 100, **kw: object) -> Request:
    return Request(seq, str(kw.pop("tenant", "a")), 0.0, inp, out, **kw)  # type: ignore[arg-type]


def test_gate_admits_while_the_staggered_budget_fits() -> None:
    gate = CapacityGate(1000, require_telemetry=False)
    first = req(0, 300, 300)
    assert gate.decide(first, 0.0).admit
    gate.dispatched(first)  # peak 600
    assert gate.admits(req(1, 100, 300), 0.0)  # (300,300),(100,300): max(600, 400+600) = 1000
    decision = gate.decide(req(2, 101, 300), 0.0)
    assert (decision.admit, decision.reason) == (False, GateReason.BUDGET)
    first.output_tokens = 200  # progress: (500, 100) leaves room
    assert gate.admits(req(2, 101, 300), 0.0)
    gate.finished(first)
    assert gate.inflight == 0


def test_prediction_replaces_max_tokens_in_the_budget() -> None:
    gate = CapacityGate(500, require_telemetry=False)
    gate.dispatched(req(0, 100, 300))
    assert not gate.admits(req(1, 100, 4000), 0.0)
    assert gate.admits(req(1, 100, 4000, predicted_output_tokens=50), 0.0)


def test_stale_or_missing_telemetry_counts_as_saturated_but_never_deadlocks() -> None:
    gate = CapacityGate(None, max_waiting_requests=0, telemetry_max_age_s=5.0)
    assert gate.admits(req(0), 0.0)  # nothing in flight: always admit one
    gate.dispatched(req(0))
    assert gate.decide(req(1), 0.0).reason is GateReason.NO_TELEMETRY
    gate.observe(EngineTelemetry(observed_s=10.0, waiting_requests=0, kv_utilization=0.5))
    assert gate.admits(req(1), 14.0)
    assert gate.decide(req(1), 15.5).reason is GateReason.STALE_TELEMETRY
    gate.observe(EngineTelemetry(observed_s=15.0, waiting_requests=3))
    assert gate.decide(req(1), 15.5).reason is GateReason.ENGINE_QUEUE
    gate.observe(EngineTelemetry(observed_s=12.0, waiting_requests=0))  # older: ignored
    assert gate.decide(req(1), 15.5).reason is GateReason.ENGINE_QUEUE


def test_gate_full_means_not_even_one_more_token_fits() -> None:
    gate = CapacityGate(200, require_telemetry=False)
    assert not gate.full
    gate.dispatched(req(0, 100, 99))  # peak 199
    assert not gate.full
    gate.dispatched(req(1, 1, 0))  # peak max(199, 101) = 199
    assert not gate.full
    gate.dispatched(req(2, 2, 98))  # (100,99),(2,98): peak max(199, 102 + 196) = 298
    assert gate.full


def test_throughput_estimate_needs_evidence_then_tracks_the_rate() -> None:
    estimate = ThroughputEstimate(half_life_s=2.0, min_span_s=3.0)
    for t in range(5):
        estimate.observe(1000, float(t))
    assert estimate.rate(2.0) is None  # less than 3 s of evidence
    assert estimate.rate(4.0) == pytest.approx(1000.0)
    for t in range(5, 30):
        estimate.observe(200, float(t))
    assert estimate.rate(29.0) == pytest.approx(200.0, rel=0.01)


def _rejecter(fair: bool) -> EarlyRejection:
    estimate = ThroughputEstimate(min_span_s=1.0)
    for t in range(3):
        estimate.observe(1000, float(t))  # 1000 tokens/s
    return EarlyRejection(
        {Tier.IW_FAST: 1.0, Tier.IW_NORMAL: 10.0},
        estimate,
        rule=RULE_BANDED if fair else RULE_TIERS,
    )


def test_fcfs_rejects_behind_a_long_queue_but_not_niw() -> None:
    rejecter = _rejecter(fair=False)
    for i in range(40):  # 40 x 200 = 8000 tokens of iw-f queued: 8 s of work
        rejecter.backlog.add(req(i, tenant="heavy", tier=Tier.IW_FAST))
    assert rejecter.should_reject(req(100, tier=Tier.IW_FAST), 2.0)  # 8.1 s > 1 s
    assert not rejecter.should_reject(req(101, tier=Tier.IW_NORMAL), 2.0)  # 8.1 s < 10 s
    for i in range(40):  # a lower tier's backlog is never ahead
        rejecter.backlog.add(req(200 + i, tenant="bulk", tier=Tier.NIW))
    # the queue ahead and its own prompt; its own output does not delay its first token
    assert rejecter.expected_wait_s(req(102, tier=Tier.IW_NORMAL), 2.0) == pytest.approx(8.1)
    assert not rejecter.should_reject(req(102, tier=Tier.NIW), 2.0)  # no TTFT target


def test_fair_policies_do_not_reject_light_tenants_for_a_heavy_tenants_backlog() -> None:
    rejecter = _rejecter(fair=True)
    for i in range(40):
        rejecter.backlog.add(req(i, tenant="heavy", tier=Tier.IW_FAST))
    light = req(100, tenant="light", tier=Tier.IW_FAST)
    # its prompt and as much of the heavy backlog (min(8000, 100)), not 'its work x tenants'
    assert rejecter.expected_wait_s(light, 2.0) == pytest.approx(0.2)
    assert not rejecter.should_reject(light, 2.0)
    assert rejecter.should_reject(req(101, tenant="heavy", tier=Tier.IW_FAST), 2.0)
    for i in range(40):
        rejecter.backlog.discard(req(i, tenant="heavy", tier=Tier.IW_FAST))
    assert rejecter.expected_wait_s(light, 2.0) == pytest.approx(0.1)


def test_no_rejection_without_throughput_evidence() -> None:
    rejecter = EarlyRejection({Tier.IW_FAST: 0.001}, ThroughputEstimate(), rule=RULE_TIERS)
    rejecter.backlog.add(req(0))
    assert not rejecter.should_reject(req(1, tier=Tier.IW_FAST), 0.0)
