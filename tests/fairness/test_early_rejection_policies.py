"""Early rejection counts what the configured policy really serves first.

Only DRR serves tiers as strict bands. Under VTC and WSC tenants are ordered by counters, so a
light lower-tier tenant is not behind a heavy higher-tier tenant's whole backlog; under FCFS with
FIFO ordering every earlier request is ahead, lower tiers included.
"""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.api.enums import Ordering, PolicyName, Tier
from fleetwarden.fairness.admission import AheadRule, EarlyRejection, ahead_rule
from fleetwarden.fairness.config import FairnessConfig, TenantConfig
from fleetwarden.fairness.drain import ThroughputEstimate
from fleetwarden.fairness.render import standalone_config
from fleetwarden.fairness.request import TIER_RANK, Request
from fleetwarden.fairness.scheduler import FairScheduler

TIERS = list(TIER_RANK)
RATE = 1000.0


def scheduler(policy: PolicyName, ordering: Ordering = Ordering.FIFO) -> FairScheduler:
    """A scheduler under `policy` whose drain rate reads 1000 tokens/s, targets 10 s (iw-n, niw)
    and 1 s (iw-f)."""
    base = standalone_config("m").model_dump()
    base.update(
        policy=policy,
        ordering=ordering,
        tiers={
            "iw-f": {"ttft_s": 1.0, "tbt_s": 1.0},
            "iw-n": {"ttft_s": 10.0, "tbt_s": 1.0},
            "niw": {"ttft_s": 10.0, "tbt_s": 1.0},
        },
    )
    s = FairScheduler(FairnessConfig.model_validate(base))
    drain = s._early.estimate
    drain.resume(0.0)  # as if the gate had held requests back from t = 0
    for second in range(1, 11):
        drain.observe(round(RATE), float(second))
    return s


def req(seq: int, tenant: str, tier: Tier, inp: int = 100, out: int = 900) -> Request:
    return Request(seq, tenant, 0.0, inp, out, tier=tier)


def test_vtc_does_not_put_a_light_lower_tier_tenant_behind_a_heavy_higher_tier_one() -> None:
    """A heavy iw-f tenant has 20 x 1000 tokens queued; a light iw-n tenant's request (100-token
    prompt) has only 100 of it ahead under VTC's equal sharing: 0.2 s. The old tier rule counted
    all 20,000 tokens (20.1 s > 10 s) and refused it."""
    for policy in (PolicyName.VTC, PolicyName.WSC):
        s = scheduler(policy)
        for seq in range(20):
            s._early.backlog.add(req(seq, "heavy", Tier.IW_FAST))
        light = req(100, "light", Tier.IW_NORMAL)
        assert s._early.expected_wait_s(light, 10.0) == 0.2, policy
        assert s.offer(light, 10.0).queued, policy


def test_fcfs_fifo_counts_a_lower_tier_queued_earlier() -> None:
    """Under FCFS-FIFO 15 niw requests (15,000 tokens) queued earlier are served before a new
    iw-n request: 15.1 s > 10 s. The old tier rule counted nothing ahead and admitted it."""
    s = scheduler(PolicyName.FCFS)
    for seq in range(15):
        s._early.backlog.add(req(seq, "batch", Tier.NIW))
    late = req(100, "user", Tier.IW_NORMAL)
    assert s._early.expected_wait_s(late, 10.0) == 15.1
    assert not s.offer(late, 10.0).queued
    # Under a priority ordering FCFS serves iw-n first: the tier rule stays.
    p = scheduler(PolicyName.FCFS, Ordering.PRIORITY)
    for seq in range(15):
        p._early.backlog.add(req(seq, "batch", Tier.NIW))
    assert p._early.expected_wait_s(late, 10.0) == 0.1
    assert p.offer(late, 10.0).queued


def test_drr_keeps_strict_tier_bands() -> None:
    """DRR serves the iw-f band first: the heavy iw-f tenant's 20,000 tokens are all ahead of a
    light iw-n tenant (20.1 s, refused), and a niw backlog is not (0.1 s). DRR bands tenants by
    their configured tier, so heavy and batch are configured in the tiers they label."""
    s = scheduler(PolicyName.DRR)
    banded = {"heavy": Tier.IW_FAST, "batch": Tier.NIW}
    tenants = {
        t: TenantConfig(weight=1, tier=tier, priority_factor=1) for t, tier in banded.items()
    }
    s.reconfigure(s.config.model_copy(update={"tenants": tenants}), 0.0)
    assert s._early.rule is AheadRule.BANDED_SHARES
    for seq in range(20):
        s._early.backlog.add(req(seq, "heavy", Tier.IW_FAST))
    for seq in range(20, 40):
        s._early.backlog.add(req(seq, "batch", Tier.NIW))
    light = req(100, "light", Tier.IW_NORMAL)
    assert s._early.expected_wait_s(light, 10.0) == 20.1
    assert not s.offer(light, 10.0).queued


def test_vtc_priority_ordering_counts_only_the_tenants_own_requests_served_first() -> None:
    """Under priority ordering a tenant's own niw backlog waits behind its new iw-n request."""
    s = scheduler(PolicyName.VTC, Ordering.PRIORITY)
    for seq in range(20):
        s._early.backlog.add(req(seq, "me", Tier.NIW))
    mine = req(100, "me", Tier.IW_NORMAL)
    assert s._early.backlog.queued_ahead(mine, rule=s._early.rule) == 0
    assert s.offer(mine, 10.0).queued


def test_rules_by_policy_and_ordering() -> None:
    assert ahead_rule(PolicyName.FCFS, Ordering.FIFO) is AheadRule.EVERYTHING
    for ordering in (Ordering.PRIORITY, Ordering.EDF, Ordering.DPA):
        assert ahead_rule(PolicyName.FCFS, ordering) is AheadRule.TIERS
    for ordering in Ordering:
        assert ahead_rule(PolicyName.DRR, ordering) is AheadRule.BANDED_SHARES
    for policy in (PolicyName.VTC, PolicyName.WSC, PolicyName.LCF):
        assert ahead_rule(policy, Ordering.PRIORITY) is AheadRule.SHARES_BY_PRIORITY
        for ordering in (Ordering.FIFO, Ordering.EDF, Ordering.DPA):
            assert ahead_rule(policy, ordering) is AheadRule.SHARES


# -- the rule, property-tested against a brute force ---------------------------------------------

Queued = list[tuple[str, Tier, int, int]]

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


def brute_force_ahead(backlog: Queued, request: Request, rule: AheadRule) -> int:
    """Each rule as its docstring states it, by a scan."""
    rank = request.tier_rank
    prompt = request.input_tokens
    if rule is AheadRule.EVERYTHING:
        return sum(i + o for _, _, i, o in backlog)
    higher = sum(i + o for _, tier, i, o in backlog if TIER_RANK[tier] < rank)
    if rule is AheadRule.TIERS:
        return higher + sum(i + o for _, tier, i, o in backlog if tier is request.tier)
    by_tenant: dict[str, int] = defaultdict(int)
    if rule is AheadRule.BANDED_SHARES:
        for tenant, tier, i, o in backlog:
            if tier is request.tier:
                by_tenant[tenant] += i + o
        mine = by_tenant.pop(request.tenant, 0)
        return higher + mine + sum(min(b, mine + prompt) for b in by_tenant.values())
    for tenant, _, i, o in backlog:
        by_tenant[tenant] += i + o
    whole = by_tenant.pop(request.tenant, 0)
    mine = whole
    if rule is AheadRule.SHARES_BY_PRIORITY:
        mine = sum(
            i + o
            for tenant, tier, i, o in backlog
            if tenant == request.tenant and TIER_RANK[tier] <= rank
        )
    return mine + sum(min(b, mine + prompt) for b in by_tenant.values())


@settings(max_examples=400, deadline=None)
@given(
    backlog=queued_requests,
    tenant=st.sampled_from(["a", "b", "x"]),
    tier=st.sampled_from(TIERS),
    inp=big_or_small,
    out=big_or_small,
    rule=st.sampled_from(list(AheadRule)),
    removed=st.lists(st.integers(0, 29), max_size=10),
)
def test_the_estimate_is_the_rule_within_a_sixteenth(
    backlog: Queued,
    tenant: str,
    tier: Tier,
    inp: int,
    out: int,
    rule: AheadRule,
    removed: list[int],
) -> None:
    estimate = ThroughputEstimate()
    for second in range(11):
        estimate.observe(round(RATE), float(second))
    er = EarlyRejection(dict.fromkeys(TIERS, 1.0), estimate, rule=rule)
    requests = [Request(seq, t, 0.0, i, o, tier=tr) for seq, (t, tr, i, o) in enumerate(backlog)]
    for request in requests:
        er.backlog.add(request)
    gone = {seq for seq in removed if seq < len(requests)}
    for seq in gone:
        er.backlog.discard(requests[seq])
    left = [q for seq, q in enumerate(backlog) if seq not in gone]
    request = Request(99, tenant, 0.0, inp, out, tier=tier)
    exact = brute_force_ahead(left, request, rule)
    ahead = er.backlog.queued_ahead(request, rule=rule)
    # The shared sums are bucketed: at most 1/16 of a share short, never over.
    assert exact * 16 / 17 - 1e-9 <= ahead <= exact
    if rule in (AheadRule.EVERYTHING, AheadRule.TIERS):
        assert ahead == exact
    if exact == 0:
        assert not er.should_reject(request, 10.0)  # nothing ahead, no rejection
