"""VTC under DPA, whose heads move with time alone: counters exact, ties as documented.

Review script `vtc_dpa_tie.py`: at equal counters an entry below the top of VTC's heap keeps the
head seq it was filed with, so a tenant whose DPA head turned urgent (a lower seq) can lose a tie
it would win by its head now. That is kept, and documented in `vtc.py` as WSC and DRR document
it: making ties exact would re-read the head of every tenant tied at the least counter on each
decision, and the lift puts every joining tenant at exactly that counter (O(n) per decision).
What must hold, and is checked here against a scan: the dispatching tenant has the least counter,
what it dispatches is its head now, and a tenant that is touched competes with its head now.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.api.enums import Ordering, Tier
from fleetwarden.fairness.ordering import queue_factory
from fleetwarden.fairness.request import Request
from fleetwarden.fairness.vtc import VirtualTokenCounter

DPA = queue_factory(Ordering.DPA, severely_expired_s=2.0, urgent_within_s=0.5)


def dpa_vtc() -> VirtualTokenCounter:
    return VirtualTokenCounter(queue_factory=DPA)


def request(seq: int, tenant: str, tier: Tier, deadline: float | None) -> Request:
    return Request(
        seq=seq,
        tenant=tenant,
        arrival_s=0.0,
        input_tokens=0,
        max_output_tokens=1,
        tier=tier,
        deadline_s=deadline,
    )


def review_case() -> tuple[VirtualTokenCounter, Request]:
    """A: seq 4 (IW-F, due 10) heads at t=0 before seq 1 (IW-N, due 1.0, urgent from 0.5); B: seq
    3 (IW-F, due 10). Both counters 0."""
    policy = dpa_vtc()
    a1 = request(1, "A", Tier.IW_NORMAL, 1.0)
    policy.push(request(4, "A", Tier.IW_FAST, 10.0), 0.0)
    policy.push(a1, 0.0)
    policy.push(request(3, "B", Tier.IW_FAST, 10.0), 0.0)
    return policy, a1


def test_an_untouched_tie_keeps_its_filed_head_and_a_touch_refreshes_it() -> None:
    policy, a1 = review_case()
    assert policy.counters == {"A": 0.0, "B": 0.0}
    head = policy.peek(0.6)
    assert head is not None
    assert head.seq in (1, 3)  # a tie: either tenant's head now
    # Touching A (a push behind its head re-reads the head under DPA) files seq 1: exact again.
    policy.push(request(5, "A", Tier.NIW, None), 0.6)
    head = policy.peek(0.6)
    assert head is a1


def test_a_tie_at_the_top_reads_its_own_head_now() -> None:
    """The top entry is always re-read: once B has gone, A dispatches its head as of now."""
    policy, a1 = review_case()
    first = policy.pop(0.0)
    assert first is not None
    assert first.seq == 3  # t=0: heads 4 and 3, counters equal
    assert policy.pop(0.6) is a1  # A's head is now the urgent seq 1, not the filed seq 4


TIERS = st.sampled_from([Tier.IW_FAST, Tier.IW_NORMAL, Tier.NIW])
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("push"),
            st.sampled_from("abcd"),
            TIERS,
            st.one_of(st.none(), st.floats(0, 6)),
            st.integers(0, 50),
        ),
        st.tuples(st.just("pop")),
        st.tuples(st.just("charge"), st.integers(0, 100), st.integers(-5, 20)),
        st.tuples(st.just("tick"), st.floats(0, 1.5)),
    ),
    min_size=20,
    max_size=100,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_the_least_counter_dispatches_its_head_now(script: list[tuple[Any, ...]]) -> None:
    """Against a scan: at every pop the tenant dispatching has the least counter among queued
    tenants, and the request is its queue's head at that time."""
    policy = dpa_vtc()
    queued: dict[str, list[Request]] = {}
    running: list[Request] = []
    now, seq = 0.0, 0
    for op in script:
        if op[0] == "push":
            _, tenant, tier, due, tokens = op
            r = request(seq, tenant, tier, None if due is None else now + due)
            r.input_tokens = tokens
            seq += 1
            policy.push(r, now)
            queued.setdefault(tenant, []).append(r)
        elif op[0] == "pop":
            counters = dict(policy.counters)
            heads = {}
            for tenant, waiting in queued.items():
                if waiting:
                    probe = DPA()
                    for r in waiting:
                        probe.push(r)
                    heads[tenant] = probe.head(now)
            got = policy.pop(now)
            if not heads:
                assert got is None
                continue
            assert got is not None
            assert counters[got.tenant] == min(counters[t] for t in heads)
            assert got is heads[got.tenant]
            queued[got.tenant].remove(got)
            running.append(got)
        elif op[0] == "charge" and running:
            _, pick, tokens = op
            r = running[pick % len(running)]
            if tokens >= 0:
                policy.charge(r, output_tokens=tokens, now=now)
                r.output_tokens += tokens
            else:
                policy.charge(r, input_tokens=tokens, now=now)
        elif op[0] == "tick":
            now += op[1]
