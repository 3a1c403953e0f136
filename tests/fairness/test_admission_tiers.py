"""Early rejection counts the work the running policy really serves first.

Three cases a review left open, each checked against the real policy's dispatch order, then the
share weights at the edges of what a config allows (the treap: `test_backlog_index`):

- DRR bands a tenant by its configured tier (`DeficitRoundRobin.tier_of`), not by the tier its
  requests are labelled with (the sidecar's `x-fleetwarden-tier` header).
- Under EDF (and DPA, approximately) a tenant's own requests due later are served after a new one.
- Weighted VTC (and WSC's weight / priority factor) gives a heavy tenant more than an equal share.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.api.enums import Ordering, PolicyName, Tier
from fleetwarden.fairness.admission import AheadRule, EarlyRejection, request_work
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.drain import ThroughputEstimate
from fleetwarden.fairness.drr import DeficitRoundRobin
from fleetwarden.fairness.render import standalone_config
from fleetwarden.fairness.request import TIER_RANK, Request
from fleetwarden.fairness.scheduler import FairScheduler

TIERS = list(TIER_RANK)
RATE = 1000


def scheduler(
    policy: PolicyName,
    ordering: Ordering = Ordering.FIFO,
    *,
    tenants: dict[str, dict[str, Any]] | None = None,
) -> FairScheduler:
    """A scheduler whose drain rate reads 1000 tokens/s from t = 5 s on; targets 1 s (iw-f) and
    10 s (iw-n, niw). Offers before t = 5 s are never rejected (no rate yet): `enqueue` uses that."""
    base = standalone_config("m").model_dump()
    base.update(
        policy=policy,
        ordering=ordering,
        tiers={
            "iw-f": {"ttft_s": 1.0, "tbt_s": 1.0},
            "iw-n": {"ttft_s": 10.0, "tbt_s": 1.0},
            "niw": {"ttft_s": 10.0, "tbt_s": 1.0},
        },
        tenants={
            name: {"weight": 1.0, "tier": "iw-n", "priority_factor": 1.0, **settings}
            for name, settings in (tenants or {}).items()
        },
    )
    s = FairScheduler(FairnessConfig.model_validate(base))
    drain = s._early.estimate
    drain.resume(0.0)
    for second in range(1, 11):
        drain.observe(RATE, float(second))
    return s


def enqueue(s: FairScheduler, *requests: Request) -> None:
    for request in requests:
        assert s.offer(request, 1.0).queued


def served_before(s: FairScheduler, request: Request, now: float) -> int:
    """Work the scheduler's policy dispatches before `request` (it must be queued)."""
    total = 0
    while (popped := s.policy.pop(now)) is not request:
        assert popped is not None
        total += request_work(popped)
    return total


def req(
    seq: int,
    tenant: str,
    tier: Tier,
    inp: int = 100,
    out: int = 900,
    deadline: float | None = None,
) -> Request:
    return Request(seq, tenant, 1.0, inp, out, tier=tier, deadline_s=deadline)


# -- 1. DRR bands by the configured tier ---------------------------------------------------------


def test_drr_does_not_put_a_label_above_its_configured_band() -> None:
    """`batch` is configured niw but labels its 20 requests iw-f: DRR queues them in the niw band,
    behind an iw-n user's request, which has nothing ahead. Banded by label, 20,000 tokens were
    counted ahead (20.1 s > 10 s) and the user was refused."""
    s = scheduler(PolicyName.DRR, tenants={"batch": {"tier": "niw"}, "user": {}})
    enqueue(s, *(req(seq, "batch", Tier.IW_FAST) for seq in range(20)))
    user = req(100, "user", Tier.IW_NORMAL)
    assert s._early.expected_wait_s(user, 10.0) == 0.1
    assert s.offer(user, 10.0).queued
    assert served_before(s, user, 10.0) == 0


def test_drr_counts_a_configured_higher_band_whatever_its_label() -> None:
    """`vip` is configured iw-f and labels its requests niw: DRR serves them all before an iw-n
    request (20.1 s > 10 s: refused). Banded by label they were behind it and it was admitted."""
    s = scheduler(PolicyName.DRR, tenants={"vip": {"tier": "iw-f"}, "user": {}})
    enqueue(s, *(req(seq, "vip", Tier.NIW) for seq in range(20)))
    user = req(100, "user", Tier.IW_NORMAL)
    assert s._early.expected_wait_s(user, 10.0) == 20.1
    assert not s.offer(user, 10.0).queued
    enqueue(s, user)
    assert served_before(s, user, 10.0) == 20_000


def test_drr_places_the_new_request_in_its_tenants_band() -> None:
    """An iw-f label does not lift a niw tenant's new request over the iw-n band's backlog."""
    s = scheduler(PolicyName.DRR, tenants={"batch": {"tier": "niw"}, "user": {}})
    enqueue(s, *(req(seq, "user", Tier.IW_NORMAL) for seq in range(5)))
    jumper = req(100, "batch", Tier.IW_FAST)
    assert s._early.expected_wait_s(jumper, 10.0) == 5.1
    enqueue(s, jumper)
    assert served_before(s, jumper, 10.0) == 5000


def test_only_drr_bands_by_configured_tier() -> None:
    """FCFS with priority ordering orders by the request's own tier: its rule keeps the label."""
    s = scheduler(PolicyName.FCFS, Ordering.PRIORITY, tenants={"batch": {"tier": "niw"}})
    enqueue(s, *(req(seq, "batch", Tier.IW_FAST) for seq in range(20)))
    user = req(100, "user", Tier.IW_NORMAL)
    assert s._early.expected_wait_s(user, 10.0) == 20.1
    enqueue(s, user)
    assert served_before(s, user, 10.0) == 20_000


# -- 2. a tenant's own later-deadline work is not ahead under EDF (and DPA) -----------------------


def test_edf_own_backlog_due_later_is_not_ahead() -> None:
    """A tenant has 20 requests due at t = 100 s queued; its new request is due at t = 15 s. EDF
    serves the new one first, so nothing is ahead; counting its whole backlog said 20.1 s and
    refused it. Under VTC, WSC and LCF, and under DRR with EDF or its default priority ordering."""
    cases = [(p, Ordering.EDF) for p in (PolicyName.VTC, PolicyName.WSC, PolicyName.LCF)]
    cases += [(PolicyName.DRR, Ordering.EDF), (PolicyName.DRR, Ordering.PRIORITY)]
    for policy, ordering in cases:
        s = scheduler(policy, ordering)
        enqueue(s, *(req(seq, "me", Tier.IW_NORMAL, deadline=100.0) for seq in range(20)))
        urgent = req(100, "me", Tier.IW_NORMAL, deadline=15.0)
        assert s._early.expected_wait_s(urgent, 10.0) == 0.1, (policy, ordering)
        assert s.offer(urgent, 10.0).queued, (policy, ordering)
        assert served_before(s, urgent, 10.0) == 0, (policy, ordering)
        # A request due after the backlog still has all of it ahead.
        late = req(101, "me", Tier.IW_NORMAL, deadline=200.0)  # 21 queued now
        assert s._early.expected_wait_s(late, 10.0) == 21.1, (policy, ordering)


def test_dpa_own_backlog_due_later_is_not_ahead() -> None:
    """DPA serves by deadline within its urgency classes: the same case, counted by deadline."""
    for policy in (PolicyName.VTC, PolicyName.WSC, PolicyName.DRR):
        s = scheduler(policy, Ordering.DPA)
        enqueue(s, *(req(seq, "me", Tier.IW_NORMAL, deadline=100.0) for seq in range(20)))
        urgent = req(100, "me", Tier.IW_NORMAL, deadline=15.0)
        assert s._early.expected_wait_s(urgent, 10.0) == 0.1, policy
        assert s.offer(urgent, 10.0).queued, policy
        assert served_before(s, urgent, 10.0) == 0, policy


def test_the_fair_share_follows_the_own_work_ahead() -> None:
    """Under VTC-EDF another tenant's share is min(b, mine + p) with mine the own work due no
    later: 0 own work ahead, a 100-token prompt, so 100 of the other tenant's 20,000."""
    s = scheduler(PolicyName.VTC, Ordering.EDF)
    enqueue(s, *(req(seq, "me", Tier.IW_NORMAL, deadline=100.0) for seq in range(20)))
    enqueue(s, *(req(seq, "other", Tier.IW_NORMAL, deadline=50.0) for seq in range(20, 40)))
    urgent = req(100, "me", Tier.IW_NORMAL, deadline=15.0)
    assert s._early.backlog.queued_ahead(urgent, rule=s._early.rule) == 100


queued = st.lists(
    st.tuples(
        st.sampled_from(["me", "a", "b"]),
        st.sampled_from(TIERS),
        st.integers(0, 3000),
        st.integers(0, 3000),
        st.none() | st.floats(0.0, 100.0),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(
    backlog=queued,
    configured=st.tuples(*[st.sampled_from(TIERS)] * 3),
    ordering=st.sampled_from([Ordering.FIFO, Ordering.PRIORITY, Ordering.EDF]),
    label=st.sampled_from(TIERS),
    deadline=st.none() | st.floats(0.0, 100.0),
    inp=st.integers(0, 3000),
)
def test_drr_estimate_is_the_work_drr_serves_first(
    backlog: list[tuple[str, Tier, int, int, float | None]],
    configured: tuple[Tier, Tier, Tier],
    ordering: Ordering,
    label: Tier,
    deadline: float | None,
    inp: int,
) -> None:
    """With no other tenant in the new request's band (so no share is estimated), the work ahead
    is exactly what DRR dispatches before it: every higher band, and the own requests its
    ordering puts first, whatever tiers the requests are labelled with."""
    tiers = dict(zip(["me", "a", "b"], configured, strict=True))
    mine = [q for q in backlog if q[0] == "me" or tiers[q[0]] is not tiers["me"]]
    s = scheduler(
        PolicyName.DRR, ordering, tenants={t: {"tier": tier.value} for t, tier in tiers.items()}
    )
    assert isinstance(s.policy, DeficitRoundRobin)
    enqueue(s, *(req(seq, *q) for seq, q in enumerate(mine)))
    new = req(99, "me", label, inp, 500, deadline)
    ahead = s._early.backlog.queued_ahead(new, rule=s._early.rule)
    enqueue(s, new)
    assert ahead == served_before(s, new, 10.0)


@settings(max_examples=150, deadline=None)
@given(
    backlog=st.lists(
        st.tuples(
            st.sampled_from(TIERS),
            st.integers(0, 3000),
            st.integers(0, 3000),
            st.none() | st.floats(0.0, 100.0),
        ),
        max_size=25,
    ),
    policy=st.sampled_from([PolicyName.VTC, PolicyName.WSC, PolicyName.LCF]),
    label=st.sampled_from(TIERS),
    deadline=st.none() | st.floats(0.0, 100.0),
    inp=st.integers(0, 3000),
)
def test_edf_estimate_is_the_own_work_served_first(
    backlog: list[tuple[Tier, int, int, float | None]],
    policy: PolicyName,
    label: Tier,
    deadline: float | None,
    inp: int,
) -> None:
    """One tenant under a counter policy with EDF: the work ahead is its own queue's, in EDF."""
    s = scheduler(policy, Ordering.EDF)
    enqueue(s, *(req(seq, "me", *q) for seq, q in enumerate(backlog)))
    new = req(99, "me", label, inp, 500, deadline)
    ahead = s._early.backlog.queued_ahead(new, rule=s._early.rule)
    enqueue(s, new)
    assert ahead == served_before(s, new, 10.0)


def test_own_order_survives_removals_and_reconfiguration() -> None:
    """Cancelled and dispatched requests leave the ordered index; a new config rebuilds it."""
    s = scheduler(PolicyName.VTC, Ordering.EDF)
    backlog = [req(seq, "me", Tier.IW_NORMAL, deadline=float(seq)) for seq in range(10)]
    enqueue(s, *backlog)
    probe = req(100, "me", Tier.IW_NORMAL, inp=0, deadline=4.5)
    assert s._early.backlog.queued_ahead(probe, rule=s._early.rule) == 5000  # seqs 0-4
    s.cancel(backlog[2], 2.0)
    assert s.dispatch(2.0) is backlog[0]
    assert s._early.backlog.queued_ahead(probe, rule=s._early.rule) == 3000  # seqs 1, 3, 4
    s.reconfigure(s.config.model_copy(update={"ordering": Ordering.DPA}), 3.0)
    assert s._early.backlog.queued_ahead(probe, rule=s._early.rule) == 3000


# -- 3. weighted shares --------------------------------------------------------------------------


def test_weighted_vtc_gives_a_heavy_tenant_its_weighted_share() -> None:
    """`big` (weight 4) has 10 x 500 tokens queued, `small` (weight 1) 40 x 500. Until big has
    been served its 5000 and the new 500-token prompt, VTC serves small a quarter as much: 1375.
    An equal share (5500 of small's) said 11.0 s and refused big's request; it waits about 6.9 s,
    and VTC itself dispatches 5000 + 1500 (small's requests come whole) before it."""
    s = scheduler(PolicyName.VTC, tenants={"big": {"weight": 4.0}, "small": {}})
    enqueue(s, *(req(seq, "big", Tier.IW_NORMAL, 500, 0) for seq in range(10)))
    enqueue(s, *(req(seq, "small", Tier.IW_NORMAL, 500, 0) for seq in range(10, 50)))
    new = req(100, "big", Tier.IW_NORMAL, 500, 0)
    wait = s._early.expected_wait_s(new, 10.0)
    assert wait is not None
    assert 6.8 < wait <= 6.875
    assert s.offer(new, 10.0).queued
    assert served_before(s, new, 10.0) == 6500
    # The light tenant's view: big keeps pace four times as fast, up to its backlog.
    light = req(101, "light", Tier.IW_NORMAL, 100, 0)
    assert s._early.backlog.queued_ahead(light, rule=s._early.rule) == 400 + 100


def test_wsc_shares_follow_weight_over_priority_factor() -> None:
    """WSC charges E / weight per unit: weight 2 and E 0.5 make a share four times the norm."""
    s = scheduler(PolicyName.WSC, tenants={"big": {"weight": 2.0, "priority_factor": 0.5}})
    enqueue(s, *(req(seq, "small", Tier.IW_NORMAL, 500, 0) for seq in range(40)))
    new = req(100, "big", Tier.IW_NORMAL, 400, 0)
    assert s._early.backlog.queued_ahead(new, rule=s._early.rule) == 100


def test_unweighted_configs_keep_equal_shares() -> None:
    s = scheduler(PolicyName.VTC, tenants={"big": {"weight": 1.0}})
    enqueue(s, *(req(seq, "small", Tier.IW_NORMAL, 500, 0) for seq in range(40)))
    new = req(100, "big", Tier.IW_NORMAL, 400, 0)
    assert s._early.backlog.queued_ahead(new, rule=s._early.rule) == 400


weights = st.sampled_from([0.1, 0.5, 1.0, 2.0, 3.0, 7.5, 1e3])


@settings(max_examples=300, deadline=None)
@given(
    backlog=st.lists(
        st.tuples(st.sampled_from("abcde"), st.integers(0, 5000), st.integers(0, 5000)),
        max_size=30,
    ),
    tenant_weights=st.fixed_dictionaries({t: weights for t in "abcdex"}),
    tenant=st.sampled_from("abx"),
    inp=st.one_of(st.integers(0, 3000), st.integers(0, 2**42)),
    extra=st.lists(st.tuples(st.sampled_from("abcde"), st.integers(1, 5000)), max_size=5),
)
def test_weighted_share_is_a_lower_bound_within_a_sixteenth_and_monotone(
    backlog: list[tuple[str, int, int]],
    tenant_weights: dict[str, float],
    tenant: str,
    inp: int,
    extra: list[tuple[str, int]],
) -> None:
    """The bucketed weighted sum against a scan: sum of min(b_j, m * w_j / w_i), never over it,
    at most 1/16 under it (plus a token of rounding), and never smaller after more work queues."""
    estimate = ThroughputEstimate()
    er = EarlyRejection(
        {Tier.IW_NORMAL: 1.0}, estimate, rule=AheadRule.SHARES, share_weight=tenant_weights.get
    )
    for seq, (t, i, o) in enumerate(backlog):
        er.backlog.add(Request(seq, t, 0.0, i, o))
    request = Request(99, tenant, 0.0, inp, 0)
    before = -1
    for seq, (t, i) in enumerate([("a", 0), *extra], start=1000):
        if i:
            er.backlog.add(Request(seq, t, 0.0, i, 0))
            backlog.append((t, i, 0))
        mine = sum(i + o for t, i, o in backlog if t == tenant)
        others: dict[str, int] = {}
        for t, i, o in backlog:
            if t != tenant:
                others[t] = others.get(t, 0) + i + o
        m = mine + inp
        w = tenant_weights[tenant]
        exact = mine + sum(min(b, m * tenant_weights[t] / w) for t, b in others.items())
        ahead = er.backlog.queued_ahead(request, rule=AheadRule.SHARES)
        assert ahead <= exact + 1e-6
        assert ahead >= mine + (exact - mine) * 16 / 17 - 1
        assert ahead >= before
        before = ahead


def test_bad_share_weights_are_refused() -> None:
    for bad in (-1.0, 0.0, math.nan, math.inf):
        er = EarlyRejection(
            {}, ThroughputEstimate(), rule=AheadRule.SHARES, share_weight=lambda t, w=bad: w
        )
        with pytest.raises(ValueError, match="weight"):
            er.backlog.add(Request(0, "a", 0.0, 1, 1))


# -- 4. share weights of any scale ---------------------------------------------------------------


def test_tiny_weights_keep_their_ratio() -> None:
    """Weights 1e-12 and 1e-10 are a 1:100 config (TenantPolicy allows any weight > 0). In units
    of 2**-30 both rounded to one unit, so while `me` is served its 1000-token prompt `small` was
    counted as served 1000 tokens, not 10: an over-count, where the estimate must err towards
    admitting. The config's weights are now scaled so the least is 1; raw weights under a unit
    count as served nothing (still a lower bound)."""
    s = scheduler(PolicyName.VTC, tenants={"small": {"weight": 1e-12}, "me": {"weight": 1e-10}})
    for seq in range(40):
        s._early.backlog.add(req(seq, "small", Tier.IW_NORMAL, 500, 0))
    new = req(100, "me", Tier.IW_NORMAL, 1000, 0)
    assert 9 <= s._early.backlog.queued_ahead(new, rule=s._early.rule) <= 10
    raw = EarlyRejection(
        {},
        ThroughputEstimate(),
        rule=AheadRule.SHARES,
        share_weight={"small": 1e-12, "me": 1e-10}.__getitem__,
    )
    for seq in range(40):
        raw.backlog.add(req(seq, "small", Tier.IW_NORMAL, 500, 0))
    assert raw.backlog.queued_ahead(new, rule=AheadRule.SHARES) <= 10


def test_extreme_wsc_share_weights_neither_overflow_nor_fail() -> None:
    """WSC's share weight / E for weight 1e6 and E 1e-300 is 1e306: in units of 2**-30 it
    overflowed a float (OverflowError on every offer); with E 5e-324 the quotient itself was inf
    (ValueError). Both are valid configs. The heavy tenant's whole backlog is ahead of a light
    tenant, and next to none of the light one's ahead of the heavy one."""
    for factor in (1e-300, 5e-324):
        s = scheduler(PolicyName.WSC, tenants={"heavy": {"weight": 1e6, "priority_factor": factor}})
        enqueue(s, *(req(seq, "heavy", Tier.IW_NORMAL, 500, 0) for seq in range(4)))
        enqueue(s, *(req(seq, "light", Tier.IW_NORMAL, 500, 0) for seq in range(4, 8)))
        light = req(100, "light", Tier.IW_NORMAL, 100, 0)
        assert s._early.backlog.queued_ahead(light, rule=s._early.rule) == 4000
        heavy = req(101, "heavy", Tier.IW_NORMAL, 100, 0)
        assert s._early.backlog.queued_ahead(heavy, rule=s._early.rule) == 2000
        assert s.offer(heavy, 10.0).queued


scaled = st.tuples(st.sampled_from([0.1, 0.5, 1.0, 3.0, 7.5, 1e3]), st.sampled_from([1e-3, 1.0]))


@settings(max_examples=100, deadline=None)
@given(
    policy=st.sampled_from([PolicyName.VTC, PolicyName.LCF, PolicyName.WSC]),
    weight_scale=st.sampled_from([1e-12, 1.0, 1e3]),
    factor_scale=st.sampled_from([1e-300, 1.0, 1e3]),
    shares=st.fixed_dictionaries({t: scaled for t in "abcx"}),
    backlog=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 5000)), max_size=20),
    tenant=st.sampled_from("abx"),
    inp=st.integers(0, 5000),
)
def test_config_shares_hold_their_ratios_at_any_scale(
    policy: PolicyName,
    weight_scale: float,
    factor_scale: float,
    shares: dict[str, tuple[float, float]],
    backlog: list[tuple[str, int]],
    tenant: str,
    inp: int,
) -> None:
    """Through the config (`ahead_options`): the weighted sum against an exact one (fractions),
    never over it whatever the weights, and within 1/16 and a token whatever their scale while
    they are within 2**45 of each other (the defaults' included): only ratios count."""
    settings_of = {
        t: (weight_scale * w, factor_scale * e if policy is PolicyName.WSC else 1.0)
        for t, (w, e) in shares.items()
    }
    s = scheduler(
        policy,
        tenants={t: {"weight": w, "priority_factor": e} for t, (w, e) in settings_of.items()},
    )
    for seq, (t, i) in enumerate(backlog):
        s._early.backlog.add(req(seq, t, Tier.IW_NORMAL, i, 0))

    def share(t: str) -> Fraction:
        weight, factor = settings_of[t]
        return Fraction(weight) / Fraction(factor)

    mine = sum(i for t, i in backlog if t == tenant)
    others: dict[str, int] = {}
    for t, i in backlog:
        if t != tenant:
            others[t] = others.get(t, 0) + i
    m = mine + inp
    exact = mine + sum(min(Fraction(b), m * share(t) / share(tenant)) for t, b in others.items())
    ahead = s._early.backlog.queued_ahead(
        req(99, tenant, Tier.IW_NORMAL, inp, 0), rule=s._early.rule
    )
    assert ahead <= exact
    least, most = min(map(share, settings_of)), max(map(share, settings_of))
    if min(least, 1) * 2**45 >= max(most, 1):  # the defaults' share is 1 (weight 1, E 1)
        assert ahead >= mine + (exact - mine) * Fraction(16, 17) - 1
