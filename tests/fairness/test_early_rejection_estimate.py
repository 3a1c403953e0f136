"""Early rejection's estimate: only the queue really ahead, drained at the saturated engine's rate.

The reviewer's three cases (an FCFS sidecar at light load, an idle sidecar, many light tenants
beside a heavy one) were refused with requests that would have been served on time. Their
scripts are reproduced here; the property tests pin down the rule itself.
"""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.api.enums import PolicyName, Tier
from fleetwarden.fairness.admission import (
    AheadRule,
    EarlyRejection,
    ThroughputEstimate,
    request_work,
)
from fleetwarden.fairness.config import FairnessConfig, GateConfig, TenantConfig
from fleetwarden.fairness.gate import EngineTelemetry
from fleetwarden.fairness.render import standalone_config
from fleetwarden.fairness.request import TIER_RANK, Request
from fleetwarden.fairness.scheduler import FairScheduler, Refusal

TIERS = list(TIER_RANK)

# The two tiered rules the shorthand `fair` stood for: DRR's bands, and tiers alone.
RULE_BANDED, RULE_TIERS = AheadRule.BANDED_SHARES, AheadRule.TIERS


def config(**changes: object) -> FairnessConfig:
    base = standalone_config("m")
    return FairnessConfig.model_validate({**base.model_dump(), **changes})


class Seq:
    def __init__(self) -> None:
        self.next = 0

    def req(
        self, tenant: str, inp: int = 100, out: int = 1024, tier: Tier = Tier.IW_NORMAL
    ) -> Request:
        self.next += 1
        return Request(self.next, tenant, 0.0, inp, out, tier=tier)


def rejecter(
    rate: float, *, fair: bool, targets: dict[Tier, float] | None = None
) -> EarlyRejection:
    """An EarlyRejection whose estimate says `rate` tokens/s (observed for 10 s)."""
    estimate = ThroughputEstimate()
    for second in range(11):
        estimate.observe(round(rate), float(second))
    return EarlyRejection(
        targets or {Tier.IW_NORMAL: 10.0}, estimate, rule=RULE_BANDED if fair else RULE_TIERS
    )


# -- the reviewer's cases ------------------------------------------------------------------------


def test_fcfs_default_config_at_light_load_admits_on_an_empty_queue() -> None:
    """One user streams at 50 tokens/s; a second user's request finds the queue empty. The old
    estimate divided 50 + 1024 tokens by the 50 tokens/s of demand (21 s > 10 s) and refused it."""
    s = FairScheduler(standalone_config("m"))
    assert s.config.policy is PolicyName.FCFS
    assert s.config.early_rejection
    ids = Seq()
    alice = ids.req("alice", 200, 1024)
    assert s.offer(alice, 0.0).queued
    assert s.dispatch(0.0) is alice
    now = 0.0
    for _ in range(300):
        now = round(now + 0.02, 6)
        s.on_output(alice, 1, now)
        s.observe_engine(EngineTelemetry(now, 0, 0.05))
    assert s.queued == 0
    assert s.throughput.rate(now) is not None
    assert s.offer(ids.req("bob", 50, 1024), now).queued


def test_idle_sidecar_admits_on_an_empty_queue() -> None:
    """Under VTC: after a 100 tokens/s stream ended, and after an idle minute that used to drop a
    1000 tokens/s estimate to 15.6, requests that find nothing queued are all admitted."""
    cfg = standalone_config("m").model_copy(update={"policy": PolicyName.VTC})
    ids = Seq()
    s = FairScheduler(cfg)
    first = ids.req("a")
    assert s.offer(first, 0.0).queued
    s.observe_engine(EngineTelemetry(0.0, 0, 0.1))
    assert s.dispatch(0.0) is first
    now = 0.0
    while now < 20.0:
        now = round(now + 0.01, 6)
        s.on_output(first, 1, now)
    s.finish(first, now)
    assert s.offer(ids.req("b", 100, 1024), now + 0.5).queued
    assert s.offer(ids.req("b", 1000, 16), now + 0.5).queued

    s2 = FairScheduler(cfg)
    busy = ids.req("a", out=100_000)
    assert s2.offer(busy, 0.0).queued
    assert s2.dispatch(0.0) is busy
    now = 0.0
    while now < 20.0:
        now = round(now + 0.01, 6)
        s2.on_output(busy, 10, now)
    s2.finish(busy, now)
    now += 60.0
    after_idle = ids.req("a", out=50)
    assert s2.offer(after_idle, now).queued
    assert s2.dispatch(now) is after_idle
    s2.on_output(after_idle, 1, now + 0.05)
    s2.on_output(after_idle, 49, now + 1)
    s2.finish(after_idle, now + 1)
    for request in (
        ids.req("c", 20, 16),
        ids.req("c", 20, 1024),
        ids.req("d", 20, 16, tier=Tier.IW_FAST),
    ):
        assert s2.queued == 0
        assert s2.running == 0
        assert s2.offer(request, now + 1.5).queued
        s2.cancel(request, now + 1.5)


def test_fair_estimate_counts_what_each_other_tenant_really_has_queued() -> None:
    """4 x 1000 tokens of a heavy tenant and 20 light tenants with 20 tokens each, at 1000
    tokens/s: the old `mine x tenants` said 105 s and refused the heavy tenant's next request.
    Ahead of it are its own 4000, its prompt, and min(20, 4500) of each light tenant: 4.9 s."""
    er = rejecter(1000.0, fair=True)
    ids = Seq()
    for _ in range(4):
        er.backlog.add(ids.req("heavy", 500, 500))
    for i in range(20):
        er.backlog.add(ids.req(f"light{i}", 10, 10))
    new = ids.req("heavy", 500, 500)
    wait = er.expected_wait_s(new, 10.0)
    assert wait is not None
    assert abs(wait - 4.9) < 1e-9
    assert not er.should_reject(new, 10.0)


def test_the_requests_own_output_budget_is_not_ahead_of_its_first_token() -> None:
    """9000 tokens queued at 1000 tokens/s: 9.1 s with a 100-token prompt, whatever max_tokens."""
    er = rejecter(1000.0, fair=False)
    ids = Seq()
    for _ in range(9):
        er.backlog.add(ids.req("a", 500, 500))
    short, long = ids.req("b", 100, 16), ids.req("b", 100, 1024)
    assert er.expected_wait_s(short, 10.0) == er.expected_wait_s(long, 10.0)
    assert not er.should_reject(long, 10.0)


def test_delivered_output_rate_is_not_capacity() -> None:
    """A stream at 50 tokens/s is demand, not capacity: requests queued while the gate never held
    anything back (so no saturated drain was measured) are not refused on it."""
    s = FairScheduler(standalone_config("m"))
    ids = Seq()
    streaming = ids.req("alice", 200, 100_000)
    assert s.offer(streaming, 0.0).queued
    assert s.dispatch(0.0) is streaming
    now = 0.0
    for _ in range(500):
        now = round(now + 0.02, 6)
        s.on_output(streaming, 1, now)
    for _ in range(5):  # 5 x 1124 tokens queued: 112 s at the delivered 50 tokens/s
        assert s.offer(ids.req("bob", 100, 1024), now).queued
    assert s.offer(ids.req("carol", 100, 1024), now).queued


# -- a saturated engine still gets early rejection -----------------------------------------------


def saturated(*, interaction_throttling: bool = False) -> tuple[FairScheduler, Seq, list[Request]]:
    """FCFS behind a 2000-token gate: two 100 + 900 requests run, 18 wait, and one finishes
    every second, so the queue drains at 1000 tokens/s. Returns the scheduler at t = 6 s, with
    12 requests (12,000 tokens) queued, and the running requests, oldest first."""
    s = FairScheduler(
        config(
            interaction_throttling=interaction_throttling,
            gate=GateConfig(
                max_inflight_tokens=2000, max_waiting_requests=0, telemetry_max_age_s=5
            ),
            defaults=TenantConfig(weight=1, tier="iw-n", priority_factor=1, rpm=3),
        )
    )
    ids = Seq()
    s.observe_engine(EngineTelemetry(0.0, 0, 0.5))
    for i in range(20):
        assert s.offer(ids.req(f"filler{i}", 100, 900), 0.0).queued
    running = s.dispatch_ready(0.0)
    assert len(running) == 2
    assert s.queued == 18
    for second in range(1, 7):
        drain(s, running, float(second))
    assert s.queued == 12
    return s, ids, running


def drain(s: FairScheduler, running: list[Request], now: float) -> None:
    """The oldest running request finishes at `now` and the gate lets the next one in."""
    s.observe_engine(EngineTelemetry(now, 0, 0.5))
    s.finish(running.pop(0), now)
    running.extend(s.dispatch_ready(now))


def test_saturated_engine_rejects_behind_a_long_queue_and_admits_behind_a_short_one() -> None:
    s, ids, running = saturated()
    refused = s.offer(ids.req("late", 100, 16), 6.0)  # 12,000 + 100 tokens at 1000/s: 12.1 s
    assert refused.refusal is Refusal.EARLY_REJECTION
    for second in range(7, 13):
        drain(s, running, float(second))
    assert s.queued == 6
    assert s.offer(ids.req("on-time", 100, 16), 12.0).queued  # 6,100 tokens: 6.1 s


def test_idle_time_does_not_count_as_drain_time() -> None:
    """After the queue empties, an idle minute, and a new saturated spell: the drain rate is
    still 1000 tokens/s, so 7 requests ahead (7,100 tokens with the prompt: 7.1 s) do not refuse
    a request. Counting the idle minute as one slow sample would put the rate near 30/s."""
    s, ids, running = saturated()
    assert s.offer(ids.req("late", 100, 16), 6.0).refusal is Refusal.EARLY_REJECTION
    second = 6.0
    while s.queued or running:
        second += 1.0
        s.observe_engine(EngineTelemetry(second, 0, 0.5))
        s.finish(running.pop(0), second)
        running.extend(s.dispatch_ready(second))
    now = second + 60.0
    s.observe_engine(EngineTelemetry(now, 0, 0.5))
    for i in range(10):  # at most 9 ahead of each: 9.1 s
        assert s.offer(ids.req(f"again{i}", 100, 900), now).queued
    running = s.dispatch_ready(now)
    assert len(running) == 2
    drain(s, running, now + 1.0)
    assert s.queued == 7
    assert s.offer(ids.req("after-idle", 100, 16), now + 1.0).queued


def test_early_rejected_requests_use_no_quota_with_or_without_oit() -> None:
    """Only admitted requests count against RPM: three refused early (RPM limit 3), then three
    admitted once the queue is short, even under OIT with the gate's budget full."""
    for oit in (False, True):
        s, ids, running = saturated(interaction_throttling=oit)
        assert s.gate.full  # so OIT enforces the limits throughout
        for _ in range(3):
            assert s.offer(ids.req("x", 100, 16), 6.0).refusal is Refusal.EARLY_REJECTION, oit
        for second in range(7, 13):
            drain(s, running, float(second))
        for _ in range(3):
            assert s.offer(ids.req("x", 100, 16), 12.0).queued, oit


# -- the rule, property-tested -------------------------------------------------------------------

queued_requests = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d", "e"]),
        st.sampled_from(TIERS),
        st.integers(0, 5000),
        st.integers(0, 5000),
    ),
    max_size=30,
)
big_or_small = st.one_of(st.integers(0, 3000), st.integers(0, 2**42))


def build(
    backlog: list[tuple[str, Tier, int, int]], rate: float, fair: bool, target: float
) -> EarlyRejection:
    er = rejecter(rate, fair=fair, targets=dict.fromkeys(TIERS, target))
    for seq, (tenant, tier, inp, out) in enumerate(backlog):
        er.backlog.add(Request(seq, tenant, 0.0, inp, out, tier=tier))
    return er


def exact_wait_s(
    backlog: list[tuple[str, Tier, int, int]], request: Request, rate: float, fair: bool
) -> float:
    """The rule, by brute force: higher tiers, then FCFS's whole tier, or (fair) the tenant's own
    backlog plus prompt and min(backlog, that) of every other tenant of the tier."""
    rank = request.tier_rank
    higher = sum(i + o for _, tier, i, o in backlog if TIER_RANK[tier] < rank)
    same: dict[str, int] = defaultdict(int)
    for tenant, tier, i, o in backlog:
        if tier is request.tier:
            same[tenant] += i + o
    prompt = request.input_tokens
    if not fair:
        return (higher + sum(same.values()) + prompt) / rate
    mine = same.pop(request.tenant, 0) + prompt
    return (higher + mine + sum(min(b, mine) for b in same.values())) / rate


@settings(max_examples=200, deadline=None)
@given(
    tenant=st.sampled_from(["a", "b", "x"]),
    tier=st.sampled_from(TIERS),
    inp=big_or_small,
    out=big_or_small,
    rate=st.sampled_from([1.0, 50.0, 1000.0]),
    fair=st.booleans(),
)
def test_an_empty_queue_never_rejects(
    tenant: str, tier: Tier, inp: int, out: int, rate: float, fair: bool
) -> None:
    er = build([], rate, fair, target=1e-6)
    assert not er.should_reject(Request(99, tenant, 0.0, inp, out, tier=tier), 10.0)


@settings(max_examples=300, deadline=None)
@given(
    backlog=queued_requests,
    tenant=st.sampled_from(["a", "b", "x"]),
    tier=st.sampled_from(TIERS),
    inp=big_or_small,
    out=big_or_small,
    rate=st.sampled_from([50.0, 1000.0]),
    fair=st.booleans(),
    target=st.floats(0.01, 100.0),
)
def test_a_request_expected_on_time_under_the_rule_is_admitted(
    backlog: list[tuple[str, Tier, int, int]],
    tenant: str,
    tier: Tier,
    inp: int,
    out: int,
    rate: float,
    fair: bool,
    target: float,
) -> None:
    er = build(backlog, rate, fair, target)
    request = Request(99, tenant, 0.0, inp, out, tier=tier)
    exact = exact_wait_s(backlog, request, rate, fair)
    estimate = er.expected_wait_s(request, 10.0)
    assert estimate is not None
    # The estimate is the rule, or (fair: the bucketed sum) at most 1/16 below it.
    assert exact * 16 / 17 - 1e-9 <= estimate <= exact + 1e-9
    if exact <= target:
        assert not er.should_reject(request, 10.0)


@settings(max_examples=300, deadline=None)
@given(
    backlog=queued_requests,
    extra=queued_requests.filter(bool),
    tenant=st.sampled_from(["a", "b", "x"]),
    tier=st.sampled_from(TIERS),
    inp=st.integers(0, 5000),
    rate=st.sampled_from([50.0, 1000.0]),
    fair=st.booleans(),
    target=st.floats(0.01, 100.0),
)
def test_rejection_is_monotone_in_the_backlog_ahead(
    backlog: list[tuple[str, Tier, int, int]],
    extra: list[tuple[str, Tier, int, int]],
    tenant: str,
    tier: Tier,
    inp: int,
    rate: float,
    fair: bool,
    target: float,
) -> None:
    """More queued work (any tenant, any tier) never turns a refusal into an admission."""
    request = Request(99, tenant, 0.0, inp, 1024, tier=tier)
    er = build(backlog, rate, fair, target)
    before_wait = er.expected_wait_s(request, 10.0)
    before = er.should_reject(request, 10.0)
    for seq, (t, tr, i, o) in enumerate(extra, start=1000):
        er.backlog.add(Request(seq, t, 0.0, i, o, tier=tr))
        wait = er.expected_wait_s(request, 10.0)
        assert wait is not None
        assert before_wait is not None
        assert wait >= before_wait
        rejected = er.should_reject(request, 10.0)
        assert rejected or not before
        before, before_wait = rejected, wait


def test_the_estimate_only_observes_between_resume_and_pause() -> None:
    """Paused time and tokens are left out; observations at one instant are one sample."""
    estimate = ThroughputEstimate(min_span_s=1.0, paused=True)
    estimate.observe(10_000, 1.0)  # paused: ignored
    estimate.resume(2.0)
    estimate.observe(500, 3.0)
    estimate.observe(500, 3.0)  # same instant: part of the same second
    assert estimate.rate(3.0) == 1000.0
    estimate.pause()
    estimate.observe(1, 63.0)  # an idle minute: not a sample
    estimate.resume(63.0)
    estimate.observe(1000, 64.0)
    assert estimate.rate(64.0) == 1000.0
    assert request_work(Request(0, "a", 0.0, 100, 900)) == 1000
