"""A failed `FairScheduler.reconfigure` changes nothing: same version, same limits, same queue.

Before the fix the scheduler assigned the new config and version first and built the rest after,
so an exception in any later step (seen with a negative rate limit, but a bug or a MemoryError
does the same) left it half-installed: it reported the new version, enforced the old limits, and
dispatched from a fresh, empty policy while the old one held the queued requests. A retry of the
same push then answered "unchanged". Each builder is made to fail here in turn, and the
scheduler is compared with a twin that never saw the failed push.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetwarden.api.enums import PolicyName
from fleetwarden.fairness import factory
from fleetwarden.fairness import scheduler as scheduler_module
from fleetwarden.fairness.config import FairnessConfig, GateConfig, TenantConfig
from fleetwarden.fairness.gate import EngineTelemetry
from fleetwarden.fairness.render import standalone_config
from fleetwarden.fairness.request import Request, SchedulingPolicy
from fleetwarden.fairness.scheduler import FairScheduler, Refusal


class InjectedError(Exception):
    """The injected failure."""


def config(**changes: object) -> FairnessConfig:
    base = standalone_config("m")
    return FairnessConfig.model_validate({**base.model_dump(), **changes})


OLD = config(
    policy=PolicyName.FCFS,
    defaults=TenantConfig(weight=1, tier="iw-n", priority_factor=1, rpm=3),
    gate=GateConfig(max_inflight_tokens=1, max_waiting_requests=0, telemetry_max_age_s=60),
)
NEW = config(policy=PolicyName.VTC)
"""Another policy, no rate limit and no token budget: every part differs from OLD."""


def req(seq: int, tenant: str) -> Request:
    return Request(seq=seq, tenant=tenant, arrival_s=0.0, input_tokens=100, max_output_tokens=100)


def busy() -> tuple[FairScheduler, Request]:
    """OLD with one request running (the budget of 1 token holds the rest) and three queued."""
    s = FairScheduler(OLD)
    s.observe_engine(EngineTelemetry(0.0, 0, 0.1))
    for seq, tenant in enumerate(["a", "b", "a", "c"]):
        assert s.offer(req(seq, tenant), 0.0).queued
    running = s.dispatch(0.0)
    assert running is not None
    assert s.dispatch(0.0) is None
    return s, running


def refuse(*args: Any, **kwargs: Any) -> Any:
    raise InjectedError


def _patch_builder(monkeypatch: pytest.MonkeyPatch, builder: str) -> None:
    """Make one step of building a config's parts raise (only a reconfigure runs meanwhile)."""
    if builder == "RateLimiter.from_config":
        monkeypatch.setattr(scheduler_module.RateLimiter, "from_config", refuse)
    elif builder == "queue_factory":  # the ordering, built inside the policy
        monkeypatch.setattr(factory, "queue_factory", refuse)
    else:
        monkeypatch.setattr(scheduler_module, builder, refuse)


def assert_same(s: FairScheduler, twin: FairScheduler, running: Request, now: float) -> None:
    """`s` behaves as `twin` from `now` on: limits, gate, queue order, settlement."""
    assert s.version == twin.version == OLD.version
    assert s.config is OLD
    assert s.snapshot(now) == twin.snapshot(now)
    assert s.dispatch(now) is None  # the old token budget still holds the queue
    # The old RPM limit of 3 (a has 2 admitted in this minute) still applies.
    for sched in (s, twin):
        assert sched.offer(req(10, "a"), now).queued
        refused = sched.offer(req(11, "a"), now)
        assert refused.refusal is Refusal.RATE_LIMITED
    for sched, head in ((s, running), (twin, running)):
        sched.finish(head, now)
    orders = []
    for sched in (s, twin):
        order = []
        while (r := sched.dispatch(now)) is not None:
            order.append(r.seq)
            sched.finish(r, now)
        orders.append(order)
    assert orders[0] == orders[1] == [1, 2, 3, 10]  # FCFS, every queued request kept


@pytest.mark.parametrize(
    "builder",
    [
        "build_policy",
        "queue_factory",
        "RateLimiter.from_config",
        "OverloadInteractionThrottle",
        "_gate_of",
        "EarlyRejection",
    ],
)
def test_a_failing_builder_leaves_the_scheduler_as_it_was(
    monkeypatch: pytest.MonkeyPatch, builder: str
) -> None:
    s, running = busy()
    twin, twin_running = busy()
    assert running.seq == twin_running.seq
    policy, limiter, gate = s.policy, s.limiter, s.gate
    with monkeypatch.context() as patch:
        _patch_builder(patch, builder)
        with pytest.raises(InjectedError):
            s.reconfigure(NEW, 1.0)
    assert (s.policy, s.limiter, s.gate) == (policy, limiter, gate)
    assert s.queued == 3
    assert s.running == 1
    assert s.is_queued(req(1, "b"))
    assert_same(s, twin, running, 2.0)


def test_a_failure_while_migrating_the_queue_leaves_the_old_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The new policy accepts two queued requests, then fails on the third."""
    s, running = busy()
    twin, _ = busy()
    build = scheduler_module.build_policy

    def flaky(cfg: FairnessConfig, **kwargs: Any) -> SchedulingPolicy:
        policy = build(cfg, **kwargs)
        push = policy.push
        pushed = {"n": 0}

        def push_then_fail(request: Request, now: float) -> None:
            pushed["n"] += 1
            if pushed["n"] == 3:
                raise MemoryError
            push(request, now)

        policy.push = push_then_fail  # type: ignore[method-assign]
        return policy

    with monkeypatch.context() as patch:
        patch.setattr(scheduler_module, "build_policy", flaky)
        with pytest.raises(MemoryError):
            s.reconfigure(NEW, 1.0)
    assert_same(s, twin, running, 2.0)


def test_the_same_push_succeeds_once_the_cause_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The failed push did not claim NEW's version, so its retry is applied, not "unchanged"."""
    s, running = busy()
    with monkeypatch.context() as patch:
        _patch_builder(patch, "RateLimiter.from_config")
        with pytest.raises(InjectedError):
            s.reconfigure(NEW, 1.0)
    assert s.reconfigure(NEW, 1.0)
    assert s.version == NEW.version
    assert s.config is NEW
    assert (s.queued, s.running) == (3, 1)
    assert s.gate.inflight == 1  # the running request counts against the new gate
    s.finish(running, 1.5)
    order = []
    while (r := s.dispatch(2.0)) is not None:
        order.append(r.seq)
        s.finish(r, 2.0)
    assert sorted(order) == [1, 2, 3]
