"""OIT throttles on fresh evidence only: stale engine telemetry is unknown, not overload.

Before the fix `FairScheduler.overloaded` used the last KV reading and waiting queue however old
they were: an engine whose /metrics stopped answering after a 95 % reading was throttled for as
long as the sidecar ran (review script `oit_stale.py`: a second request an hour later refused
`tenant-rpm`). Telemetry older than the gate's `telemetry_max_age_s` now counts as unknown, as
`is_overloaded` documents (refusing is irreversible), while the gate keeps holding requests back on
it, and the local token budget still signals overload by itself.
"""

from __future__ import annotations

from fleetwarden.api.enums import PolicyName
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.gate import EngineTelemetry
from fleetwarden.fairness.render import standalone_config
from fleetwarden.fairness.request import Request
from fleetwarden.fairness.scheduler import FairScheduler, Refusal

MAX_AGE = 5.0


def oit_config(max_inflight_tokens: int | None = None) -> FairnessConfig:
    """WSC with OIT, rpm 1 for everyone, no early rejection; the gate's age limit is MAX_AGE."""
    base = standalone_config("m")
    return base.model_copy(
        update={
            "policy": PolicyName.WSC,
            "interaction_throttling": True,
            "early_rejection": False,
            "defaults": base.defaults.model_copy(update={"rpm": 1}),
            "gate": base.gate.model_copy(
                update={"telemetry_max_age_s": MAX_AGE, "max_inflight_tokens": max_inflight_tokens}
            ),
        }
    )


def req(seq: int, now: float, tokens: int = 10, out: int = 10) -> Request:
    return Request(seq=seq, tenant="a", arrival_s=now, input_tokens=tokens, max_output_tokens=out)


def test_an_hour_old_kv_reading_no_longer_throttles() -> None:
    """The review's reproduction: the last scrape said 95 % at t=0, then /metrics went silent."""
    s = FairScheduler(oit_config())
    s.observe_engine(EngineTelemetry(0.0, 0, 0.95))
    now = 3600.0
    assert not s.overloaded(now)
    assert s.offer(req(1, now), now).queued
    assert s.offer(req(2, now + 1), now + 1).queued  # over rpm 1, but nothing says overload
    assert s.snapshot(now + 1)["overloaded"] is False


def test_a_fresh_kv_reading_throttles_up_to_the_age_limit_inclusive() -> None:
    s = FairScheduler(oit_config())
    s.observe_engine(EngineTelemetry(100.0, 0, 0.95))
    assert s.offer(req(1, 100.0), 100.0).queued  # the first fits rpm 1 anyway
    assert s.overloaded(100.0 + MAX_AGE)  # as old as the gate accepts: still fresh
    refused = s.offer(req(2, 100.0 + MAX_AGE), 100.0 + MAX_AGE)
    assert refused.refusal is Refusal.RATE_LIMITED
    assert not s.overloaded(100.0 + MAX_AGE + 0.001)
    assert s.offer(req(3, 106.0), 106.0).queued
    # A new scrape brings the reading back into force.
    s.observe_engine(EngineTelemetry(107.0, 0, 0.95))
    assert s.offer(req(4, 107.5), 107.5).refusal is Refusal.RATE_LIMITED


def test_a_stale_waiting_queue_is_not_overload_either() -> None:
    s = FairScheduler(oit_config())
    s.observe_engine(EngineTelemetry(0.0, 50, 0.1))  # 50 waiting > max_waiting_requests 0
    assert s.overloaded(1.0)
    assert not s.overloaded(60.0)
    assert s.offer(req(1, 60.0), 60.0).queued
    assert s.offer(req(2, 61.0), 61.0).queued


def test_stale_telemetry_still_closes_the_gate() -> None:
    """Holding back is reversible: with something in flight, the gate treats stale as saturated."""
    s = FairScheduler(oit_config())
    s.observe_engine(EngineTelemetry(0.0, 0, 0.95))
    assert s.offer(req(1, 100.0), 100.0).queued
    assert s.dispatch(100.0) is not None  # nothing in flight: always admitted
    assert s.offer(req(2, 101.0), 101.0).queued  # not throttled: the telemetry is unknown
    assert s.dispatch(101.0) is None  # but not dispatched on it either


def test_the_local_token_budget_signals_overload_without_telemetry() -> None:
    s = FairScheduler(oit_config(max_inflight_tokens=100))
    s.observe_engine(EngineTelemetry(0.0, 0, 0.1))
    assert s.offer(req(1, 0.0, tokens=60, out=40), 0.0).queued
    assert s.dispatch(0.0) is not None
    now = 3600.0  # the telemetry is an hour old; the in-flight request fills the budget
    assert s.gate.full
    assert s.overloaded(now)
    assert s.offer(req(2, now), now).queued  # rpm 1: the window is empty again
    assert s.offer(req(3, now + 1), now + 1).refusal is Refusal.RATE_LIMITED
