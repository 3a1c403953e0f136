"""Idle tenants are forgotten (`fairness.idle`), so one-off tenants do not accumulate, and
forgetting keeps VTC's guarantees: the counter-gap bound, the monotone floor, and, for a tenant
at or below the floor when it is forgotten, exactly the decisions VTC makes without forgetting.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.api.enums import LengthPrediction, PolicyName
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.gate import EngineTelemetry
from fleetwarden.fairness.idle import IdleTenants, TenantRetention
from fleetwarden.fairness.prediction import MovingAverage
from fleetwarden.fairness.render import standalone_config
from fleetwarden.fairness.request import Request
from fleetwarden.fairness.scheduler import FairScheduler
from fleetwarden.fairness.vtc import TokenPrices, VirtualTokenCounter
from fleetwarden.fairness.wsc import WeightedServiceCounter
from tests.fairness.test_vtc import MiniEngine, _run, events

# -- the tracker ---------------------------------------------------------------------------------


def test_tenants_expire_in_the_order_they_went_idle() -> None:
    idle = IdleTenants(TenantRetention(forget_after_s=10.0))
    idle.idle("a", 0.0)
    idle.idle("b", 1.0)
    idle.idle("c", 2.0)
    idle.busy("b")  # b has work again: never expires while busy
    idle.idle("a", 3.0)  # a went idle again later: its clock restarts
    assert idle.expired(11.9) == ()
    assert idle.expired(12.0) == ("c",)
    assert idle.expired(13.0) == ("a",)
    assert len(idle) == 0
    assert "b" not in idle


def test_beyond_max_idle_the_longest_idle_go_first() -> None:
    idle = IdleTenants(TenantRetention(forget_after_s=math.inf, max_idle=2))
    for i, tenant in enumerate("abcd"):
        idle.idle(tenant, float(i))
    assert idle.expired(100.0) == ("a", "b")
    assert idle.expired(1e9) == ()  # by time, never
    assert len(idle) == 2


class NaiveIdle:
    """The tracker's rule with no shortcut: every call scans for what is due."""

    def __init__(self, retention: TenantRetention) -> None:
        self.retention = retention
        self.since: dict[str, float] = {}

    def idle(self, tenant: str, now: float) -> None:
        self.since.pop(tenant, None)
        self.since[tenant] = now

    def expired(self, now: float) -> tuple[str, ...]:
        gone = []
        for tenant, idle_since in list(self.since.items()):
            over = len(self.since) > self.retention.max_idle
            if not over and idle_since > now - self.retention.forget_after_s:
                break
            del self.since[tenant]
            gone.append(tenant)
        return tuple(gone)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["idle", "busy", "expired"]), st.sampled_from("abcdef")),
        max_size=80,
    ),
    st.lists(st.floats(0.0, 5.0), min_size=80, max_size=80),
    st.sampled_from([0.0, 3.0, 10.0, math.inf]),
    st.integers(0, 4),
)
def test_the_tracker_expires_exactly_what_a_full_scan_finds(
    calls: list[tuple[str, str]], steps: list[float], forget_after_s: float, max_idle: int
) -> None:
    """`next_check_s` lets `expired` skip its scan; it must never skip a due tenant."""
    retention = TenantRetention(forget_after_s=forget_after_s, max_idle=max_idle)
    fast, naive = IdleTenants(retention), NaiveIdle(retention)
    now = 0.0
    for (call, tenant), step in zip(calls, steps, strict=False):
        now += step
        if call == "idle":
            fast.idle(tenant, now)
            naive.idle(tenant, now)
        elif call == "busy":
            fast.busy(tenant)
            naive.since.pop(tenant, None)
        else:
            assert fast.expired(now) == naive.expired(now)
        assert len(fast) == len(naive.since)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"forget_after_s": -1.0}, "forget_after_s"),
        ({"forget_after_s": math.nan}, "forget_after_s"),
        ({"max_idle": -1}, "max_idle"),
    ],
)
def test_retention_rejects_impossible_values(changes: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TenantRetention(**changes)  # type: ignore[arg-type]


# -- VTC's guarantees with forgetting ------------------------------------------------------------


class ForgettingEngine(MiniEngine):
    """`MiniEngine` that makes the policy forget every tenant the moment it has nothing queued
    and nothing running (the harshest retention), or, with `at_or_below_floor`, only those whose
    counter is at or below the floor a joining tenant would be lifted to at that moment."""

    at_or_below_floor: bool = False

    def decode(self) -> None:
        super().decode()
        policy = self.policy
        busy = {r.tenant for r in self.running} | set(policy.queued_tenants())
        floor = policy.min_queued_counter()
        if floor is None:
            floor = policy._left_counter()
        for tenant in sorted(set(policy.counters) - busy):
            if self.at_or_below_floor and (floor is None or policy.counters[tenant] > floor):
                continue
            policy.forget(tenant)
        self.check()


@settings(max_examples=150, deadline=None)
@given(events)
def test_the_counter_gap_bound_holds_when_idle_tenants_are_forgotten(
    script: list[tuple[object, ...]],
) -> None:
    """Lemma 4.3 with every idle tenant forgotten at once: a returning tenant is lifted to the
    floor, so it joins inside the bound like any other."""
    _run(ForgettingEngine(VirtualTokenCounter(TokenPrices(1.0, 2.0))), script)


@settings(max_examples=150, deadline=None)
@given(events)
def test_forgetting_at_or_below_the_floor_changes_no_decision(
    script: list[tuple[object, ...]],
) -> None:
    """A tenant forgotten at or below the floor returns to the counter it would have had: the
    dispatch order and every queued tenant's counter match VTC without forgetting."""
    orders: list[list[int]] = []
    engines: list[MiniEngine] = []
    for engine in (
        MiniEngine(VirtualTokenCounter(TokenPrices(1.0, 2.0))),
        ForgettingEngine(VirtualTokenCounter(TokenPrices(1.0, 2.0))),
    ):
        engine.at_or_below_floor = True  # type: ignore[attr-defined]
        dispatched: list[int] = []
        pop = engine.policy.pop

        def recording_pop(now: float, pop: object = pop, out: list[int] = dispatched) -> object:
            request = pop(now)  # type: ignore[operator]
            if request is not None:
                out.append(request.seq)
            return request

        engine.policy.pop = recording_pop  # type: ignore[method-assign]
        _run(engine, script)
        orders.append(dispatched)
        engines.append(engine)
    assert orders[0] == orders[1]
    kept, forgetting = (e.policy for e in engines)
    for tenant in forgetting.queued_tenants():
        assert forgetting.counters[tenant] == pytest.approx(kept.counters[tenant])


def test_an_overserved_tenant_returns_to_the_floor_instead_of_keeping_its_debt() -> None:
    """The one departure from VTC (documented in `fairness.idle`): a tenant forgotten above the
    floor rejoins at the floor."""
    vtc = VirtualTokenCounter(TokenPrices(1.0, 2.0))
    vtc.push(Request(0, "heavy", 0.0, 1000, 10), 0.0)
    vtc.push(Request(1, "light", 0.0, 10, 10), 0.0)
    assert vtc.pop(0.0) is not None  # heavy (tie at 0, earlier): 1000
    vtc.push(Request(2, "light", 0.0, 10, 10), 0.0)
    vtc.forget("heavy")
    vtc.push(Request(3, "heavy", 1.0, 10, 10), 1.0)
    assert vtc.counters["heavy"] == 0.0  # lifted to light's 0, not kept at 1000
    with pytest.raises(ValueError, match="queued"):
        vtc.forget("light")


@pytest.mark.parametrize("policy", ["vtc", "wsc"])
def test_forgetting_the_last_tenant_to_leave_keeps_the_empty_queue_floor(policy: str) -> None:
    """With the queue empty, a joiner is lifted to the last leaver's counter: still so when that
    leaver was forgotten in between."""
    results = []
    for forget in (False, True):
        p = VirtualTokenCounter() if policy == "vtc" else WeightedServiceCounter()
        p.push(Request(0, "a", 0.0, 100, 10), 0.0)
        request = p.pop(0.0)
        assert request is not None
        p.charge(request, output_tokens=10, now=1.0)
        if forget:
            p.forget("a")
            assert "a" not in p.counters
        p.push(Request(1, "b", 2.0, 10, 10), 2.0)
        results.append(p.counters["b"])
    assert results[0] == results[1] > 0


def test_wsc_forgets_an_idle_user_and_refuses_a_queued_one() -> None:
    wsc = WeightedServiceCounter()
    wsc.push(Request(0, "u", 0.0, 10, 10, continuation=True), 0.0)
    with pytest.raises(ValueError, match="queued"):
        wsc.forget("u")
    assert wsc.pop(0.0) is not None
    wsc.forget("u")
    assert "u" not in wsc.counters
    assert wsc.queued_tenants() == []
    wsc.push(Request(1, "u", 1.0, 10, 10), 1.0)  # back as a new user
    assert wsc.pop(1.0) is not None


def test_the_moving_average_forgets_a_tenant() -> None:
    average = MovingAverage(window=2, default=7)
    average.observe("a", 100)
    assert average.predict("a") == 100
    average.forget("a")
    average.forget("never-seen")
    assert average.predict("a") == 7


# -- the scheduler -------------------------------------------------------------------------------


def config(**changes: object) -> FairnessConfig:
    """The standalone config without early rejection (a scheduler fed no real throughput)."""
    base = standalone_config("m").model_dump()
    return FairnessConfig.model_validate({**base, "early_rejection": False, **changes})


def serve_one_off_tenants(
    scheduler: FairScheduler, count: int, *, every_s: float, start: int = 0
) -> float:
    """One request from each of `count` new tenants (numbered from `start`, the first at
    `start * every_s`), `every_s` apart, each served at once; returns the last time."""
    now = 0.0
    for i in range(start, start + count):
        now = i * every_s
        scheduler.observe_engine(EngineTelemetry(now, 0, 0.1))
        request = Request(i, f"user-{i}", now, 100, 10)
        assert scheduler.offer(request, now).queued
        assert scheduler.dispatch(now) is request
        scheduler.on_output(request, 10, now)
        scheduler.finish(request, now)
    return now


@pytest.mark.parametrize("policy", [PolicyName.VTC, PolicyName.WSC])
def test_one_off_tenants_are_forgotten_after_the_retention_time(policy: PolicyName) -> None:
    """A new tenant per second, forgotten after 60 idle seconds: the policy and the predictor
    hold about 60 tenants after 5,000 of them, not 5,000."""
    scheduler = FairScheduler(
        config(policy=policy, length_prediction=LengthPrediction.MOVING_AVERAGE),
        retention=TenantRetention(forget_after_s=60.0),
    )
    serve_one_off_tenants(scheduler, 5_000, every_s=1.0)
    policy_state = scheduler.policy
    assert isinstance(policy_state, VirtualTokenCounter | WeightedServiceCounter)
    assert 55 <= len(policy_state.counters) <= 62
    assert scheduler._predictor is not None
    assert len(scheduler._predictor._seen) <= 62
    assert scheduler.forgotten >= 5_000 - 62
    state = scheduler.snapshot(5_000.0)
    assert state["forgottenTenants"] == scheduler.forgotten
    assert state["idleTenants"] == len(scheduler._idle) <= 62


def test_max_idle_bounds_the_tenants_kept_whatever_their_rate() -> None:
    scheduler = FairScheduler(
        config(policy=PolicyName.VTC), retention=TenantRetention(max_idle=100)
    )
    serve_one_off_tenants(scheduler, 3_000, every_s=0.001)  # 3,000 tenants in 3 s
    assert isinstance(scheduler.policy, VirtualTokenCounter)
    assert len(scheduler.policy.counters) <= 101


def test_a_tenant_with_a_running_or_queued_request_is_never_forgotten() -> None:
    scheduler = FairScheduler(
        config(policy=PolicyName.VTC), retention=TenantRetention(forget_after_s=1.0)
    )
    scheduler.observe_engine(EngineTelemetry(0.0, 0, 0.1))
    long_running = Request(0, "slow", 0.0, 100, 10_000)
    assert scheduler.offer(long_running, 0.0).queued
    assert scheduler.dispatch(0.0) is long_running
    for t in range(1, 100):  # other tenants come and go for 99 s
        serve_one_off_tenants(scheduler, 1, every_s=1.0, start=t)
        scheduler.on_output(long_running, 1, float(t))
    assert isinstance(scheduler.policy, VirtualTokenCounter)
    before = scheduler.policy.counters["slow"]
    assert before == 100 + 2 * 99  # its prompt and 99 tokens: nothing lost to a forget
    scheduler.finish(long_running, 100.0)
    assert scheduler.policy.counters["slow"] == before  # idle now, forgotten only at 101 s
    serve_one_off_tenants(scheduler, 1, every_s=1.0, start=101)
    assert "slow" not in scheduler.policy.counters


def test_a_cancelled_queued_request_can_leave_its_tenant_idle() -> None:
    scheduler = FairScheduler(
        config(policy=PolicyName.VTC), retention=TenantRetention(forget_after_s=0.0)
    )
    request = Request(0, "gone", 0.0, 100, 10)
    assert scheduler.offer(request, 0.0).queued  # no telemetry: stays queued
    scheduler.cancel(request, 1.0)
    assert scheduler.forgotten == 1
    assert isinstance(scheduler.policy, VirtualTokenCounter)
    assert "gone" not in scheduler.policy.counters


def test_the_state_view_lists_the_busiest_queues_and_named_counters_only() -> None:
    """The admin view is built on the relay's event loop: bounded whatever the tenant count."""
    scheduler = FairScheduler(config(policy=PolicyName.VTC))  # no telemetry: all stay queued
    seq = 0
    for tenant, count in (("a", 1), ("b", 5), ("c", 3), ("d", 2)):
        for _ in range(count):
            assert scheduler.offer(Request(seq, tenant, 0.0, 10, 10), 0.0).queued
            seq += 1
    state = scheduler.snapshot(0.0, limit=2)
    assert state["queuedByTenant"] == {"b": 5, "c": 3}  # the two busiest, by name
    assert set(state["counters"]) == {"b", "c"}
    assert (state["queuedTenants"], state["knownTenants"]) == (4, 4)
    state = scheduler.snapshot(0.0, limit=3)
    assert state["queuedByTenant"] == {"b": 5, "c": 3, "d": 2}
    for later in range(seq, seq + 3):  # b2 ties with c and came later: ties go by name
        assert scheduler.offer(Request(later, "b2", 0.0, 10, 10), 0.0).queued
    assert scheduler.snapshot(0.0, limit=2)["queuedByTenant"] == {"b": 5, "b2": 3}
    state = scheduler.snapshot(0.0, tenants=["a", "nobody"], limit=0)
    assert state["queuedByTenant"] == {}
    assert set(state["counters"]) == {"a"}  # named and known
