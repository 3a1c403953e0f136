"""Deficit round robin with strict tiers: turns, token accounting, bands, resets, peek == pop.

`NaiveDrr` below is the definition the policy implements, run visit by visit: every visit adds one
quantum, so it needs no round arithmetic, no lazy crediting and no heap. The policy must dispatch
exactly what it dispatches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.api.enums import (
    LengthPrediction,
    Ordering,
    PolicyName,
    QuantumUnit,
    Tier,
)
from fleetwarden.fairness.config import (
    DpaConfig,
    DrrConfig,
    FairnessConfig,
    GateConfig,
    TenantConfig,
    TokenWeightsConfig,
)
from fleetwarden.fairness.drr import DeficitRoundRobin, priority_deadline_queue
from fleetwarden.fairness.ordering import FifoQueue, RequestQueue, queue_factory
from fleetwarden.fairness.request import TIER_RANK, Request

TIERS = sorted(Tier, key=TIER_RANK.__getitem__)
Script = list[tuple[Any, ...]]


def _req(
    seq: int,
    tenant: str,
    tokens: int = 10,
    output: int = 0,
    *,
    tier: Tier = Tier.IW_NORMAL,
    deadline_s: float | None = None,
    predicted: int | None = None,
) -> Request:
    return Request(
        seq,
        tenant,
        0.0,
        tokens,
        output,
        tier=tier,
        deadline_s=deadline_s,
        predicted_output_tokens=predicted,
    )


def _drain(policy: DeficitRoundRobin, now: float = 0.0) -> list[Request]:
    out = []
    while (request := policy.pop(now)) is not None:
        out.append(request)
    return out


# -- the reference ----------------------------------------------------------------------------


@dataclass
class _NaiveFlow:
    ticket: tuple[int, int]
    next_round: int
    queue: RequestQueue
    deficit: int = 0


@dataclass
class _NaiveBand:
    quantum: int
    round: int = 0
    holder: _NaiveFlow | None = None
    flows: dict[str, _NaiveFlow] = field(default_factory=dict)


class NaiveDrr:
    """Rounds, one visit per active flow per round in ticket order, newcomers at the start of the
    next round, deficit reset on leaving; visits are simulated one at a time."""

    def __init__(self, policy: DeficitRoundRobin, factory: Callable[[], RequestQueue]) -> None:
        self._policy = policy  # for tier_of and cost only
        self._factory = factory
        self._bands = {t: _NaiveBand(policy.quanta[t]) for t in TIERS}
        self._where: dict[int, tuple[Tier, str]] = {}
        self._cost: dict[int, int] = {}
        self._joins = 0

    def push(self, request: Request, now: float) -> None:
        tier = self._policy.tier_of(request)
        band = self._bands[tier]
        flow = band.flows.get(request.tenant)
        if flow is None:
            flow = _NaiveFlow((-(band.round + 1), self._joins), band.round + 1, self._factory())
            self._joins += 1
            band.flows[request.tenant] = flow
        flow.queue.push(request)
        self._where[request.seq] = (tier, request.tenant)
        self._cost[request.seq] = self._policy.cost(request)

    def _fits(self, flow: _NaiveFlow, now: float) -> bool:
        head = flow.queue.head(now)
        return head is not None and self._cost[head.seq] <= flow.deficit

    def pop(self, now: float) -> Request | None:
        for tier in TIERS:
            band = self._bands[tier]
            if not band.flows:
                continue
            flow = band.holder
            if flow is None or not self._fits(flow, now):
                while True:  # one visit at a time
                    flow = min(band.flows.values(), key=lambda f: (f.next_round, f.ticket))
                    band.round = flow.next_round
                    flow.next_round += 1
                    flow.deficit += band.quantum
                    if self._fits(flow, now):
                        break
                band.holder = flow
            request = flow.queue.pop(now)
            flow.deficit -= self._cost.pop(request.seq)
            tenant = self._where.pop(request.seq)[1]
            if len(flow.queue) == 0:
                del band.flows[tenant]
                band.holder = None
            return request
        return None

    def deficits(self) -> dict[tuple[Tier, str], int]:
        return {(t, n): f.deficit for t, band in self._bands.items() for n, f in band.flows.items()}

    def remove(self, request: Request) -> bool:
        where = self._where.pop(request.seq, None)
        if where is None:
            return False
        band = self._bands[where[0]]
        flow = band.flows[where[1]]
        flow.queue.remove(request)
        del self._cost[request.seq]
        if len(flow.queue) == 0:
            del band.flows[where[1]]
            if band.holder is flow:
                band.holder = None
        return True


# -- scripts ----------------------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("push"),
            st.sampled_from("abcd"),
            st.sampled_from([*TIERS, Tier.IW_NORMAL, Tier.IW_NORMAL]),  # crowd one band
            st.integers(0, 300),
            st.integers(0, 200),
            st.one_of(st.none(), st.floats(0, 50)),
        ),
        st.tuples(st.just("pop"), st.integers(1, 4)),
        st.tuples(st.just("remove"), st.integers(0, 200)),
        st.tuples(st.just("tick"), st.floats(0, 5)),
    ),
    max_size=60,
)
units = st.sampled_from(list(QuantumUnit))
quanta = st.fixed_dictionaries(
    {t: st.one_of(st.integers(1, 3), st.integers(50, 400)) for t in TIERS}
)
stable_orderings = st.sampled_from(
    [FifoQueue, priority_deadline_queue, queue_factory(Ordering.EDF)]
)


@dataclass
class Run:
    """A policy driven by a script, with every other check a test wants done on the way."""

    policy: DeficitRoundRobin
    queued: dict[int, Request] = field(default_factory=dict)
    dispatched: list[int] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    now: float = 0.0
    seq: int = 0
    on_pop: Callable[[Run, Request | None], None] | None = None

    def play(self, script: Script) -> None:
        for op in script:
            if op[0] == "push":
                _, tenant, tier, tokens, output, deadline = op
                deadline_s = None if deadline is None else self.now + deadline
                request = Request(
                    self.seq, tenant, self.now, tokens, output, tier=tier, deadline_s=deadline_s
                )
                self.seq += 1
                self.queued[request.seq] = request
                self.policy.push(request, self.now)
            elif op[0] == "pop":
                for _ in range(op[1]):
                    self.pop()
            elif op[0] == "remove":
                if self.queued:
                    keys = sorted(self.queued)
                    victim = self.queued.pop(keys[op[1] % len(keys)])
                    assert self.policy.remove(victim)
                    assert not self.policy.remove(victim)
                    self.removed.append(victim.seq)
            else:
                self.now += op[1]

    def pop(self) -> Request | None:
        peeked = self.policy.peek(self.now)
        assert self.policy.peek(self.now) is peeked  # peeking twice changes nothing
        request = self.policy.pop(self.now)
        assert request is peeked
        if self.on_pop is not None:
            self.on_pop(self, request)
        if request is not None:
            assert self.queued.pop(request.seq) is request
            self.dispatched.append(request.seq)
        assert len(self.policy) == len(self.queued)
        return request

    def drain(self) -> None:
        self.now += 1000.0
        while self.pop() is not None:
            pass


# -- behaviour --------------------------------------------------------------------------------


def test_request_mode_gives_each_backlogged_tenant_one_turn_per_round() -> None:
    drr = DeficitRoundRobin(unit=QuantumUnit.REQUESTS)
    seq = 0
    for tenant, count in (("a", 6), ("b", 2), ("c", 4)):
        for _ in range(count):
            drr.push(_req(seq, tenant, tokens=1000 * seq), 0.0)  # size is irrelevant here
            seq += 1
    order = "".join(r.tenant for r in _drain(drr))
    assert order == "abcabcacacaa"


def test_request_mode_quantum_is_requests_per_turn() -> None:
    drr = DeficitRoundRobin({Tier.IW_NORMAL: 2}, unit=QuantumUnit.REQUESTS)
    for seq in range(8):
        drr.push(_req(seq, "ab"[seq // 4]), 0.0)
    assert "".join(r.tenant for r in _drain(drr)) == "aabbaabb"


def test_token_mode_shares_tokens_not_requests() -> None:
    """a's requests are twice as long: it gets about half the requests and the same tokens."""
    quantum = 300
    drr = DeficitRoundRobin({Tier.IW_NORMAL: quantum})
    for seq in range(200):
        tenant = "ab"[seq % 2]
        drr.push(_req(seq, tenant, tokens=150 if tenant == "a" else 50, output=50), 0.0)
    served = [drr.pop(0.0) for _ in range(60)]
    count = {t: sum(1 for r in served if r is not None and r.tenant == t) for t in "ab"}
    tokens = {
        t: sum(r.input_tokens + r.max_output_tokens for r in served if r and r.tenant == t)
        for t in "ab"
    }
    assert abs(tokens["a"] - tokens["b"]) <= quantum + 200  # one quantum plus one request
    assert count["b"] == pytest.approx(2 * count["a"], abs=3)


def test_token_cost_uses_the_prediction_when_set() -> None:
    drr = DeficitRoundRobin()
    assert drr.cost(_req(0, "a", tokens=100, output=500)) == 600
    assert drr.cost(_req(1, "a", tokens=100, output=500, predicted=20)) == 120
    assert DeficitRoundRobin(unit=QuantumUnit.REQUESTS).cost(_req(2, "a", 100, 500)) == 1


def test_a_tenant_does_not_bank_credit_while_idle() -> None:
    drr = DeficitRoundRobin({Tier.IW_NORMAL: 100})
    drr.push(_req(0, "a", tokens=50), 0.0)
    assert drr.pop(0.0) is not None  # a's visit: 100 credited, 50 spent, then its queue empties
    assert drr.deficit("a", Tier.IW_NORMAL) == 0
    for seq in range(1, 5):
        drr.push(_req(seq, "b", tokens=100), 1.0)
    drr.push(_req(5, "a", tokens=150), 1.0)
    # With the 50 left over, a would fit at its first visit (b a b b b); from 0 it needs two.
    assert "".join(r.tenant for r in _drain(drr, 1.0)) == "bbabb"


def test_deficit_carries_over_while_the_tenant_stays_backlogged() -> None:
    drr = DeficitRoundRobin({Tier.IW_NORMAL: 100})
    drr.push(_req(0, "a", tokens=70), 0.0)
    drr.push(_req(1, "a", tokens=120), 0.0)
    drr.push(_req(2, "b", tokens=100), 0.0)
    assert [r.seq for r in _drain(drr)] == [0, 2, 1]  # a keeps 30, gets 100 more: 130 >= 120


def test_a_higher_tier_always_goes_first() -> None:
    drr = DeficitRoundRobin(unit=QuantumUnit.REQUESTS)
    for seq in range(6):
        drr.push(_req(seq, f"t{seq}", tier=TIERS[::-1][seq % 3]), 0.0)
    assert [r.tier for r in _drain(drr)] == [Tier.IW_FAST] * 2 + [Tier.IW_NORMAL] * 2 + [
        Tier.NIW
    ] * 2


def test_the_configured_tier_wins_over_the_requests_own() -> None:
    drr = DeficitRoundRobin(unit=QuantumUnit.REQUESTS, tiers={"gold": Tier.IW_FAST})
    drr.push(_req(0, "free", tier=Tier.IW_NORMAL), 0.0)
    drr.push(_req(1, "gold", tier=Tier.NIW), 0.0)  # a gold tenant's batch work
    drr.push(_req(2, "sneaky", tier=Tier.IW_FAST), 0.0)  # not pinned: its label places it
    assert drr.tier_of(_req(3, "gold", tier=Tier.NIW)) is Tier.IW_FAST
    assert [r.seq for r in _drain(drr)] == [1, 2, 0]


def test_inside_a_tenant_priority_then_deadline_then_arrival() -> None:
    drr = DeficitRoundRobin(unit=QuantumUnit.REQUESTS)
    drr.push(_req(0, "a", tier=Tier.NIW), 0.0)
    drr.push(_req(1, "a", deadline_s=9.0), 0.0)
    drr.push(_req(2, "a"), 0.0)
    drr.push(_req(3, "a", deadline_s=5.0), 0.0)
    drr.push(_req(4, "a", tier=Tier.IW_FAST), 0.0)
    drr.push(_req(5, "a"), 0.0)
    assert [r.seq for r in _drain(drr)] == [4, 3, 1, 2, 5, 0]


def test_a_newcomer_waits_at_most_the_rest_of_the_round() -> None:
    drr = DeficitRoundRobin(unit=QuantumUnit.REQUESTS)
    for seq in range(9):
        drr.push(_req(seq, "abc"[seq % 3]), 0.0)
    assert [r.tenant for r in (drr.pop(0.0), drr.pop(0.0))] == ["a", "b"]  # type: ignore[union-attr]
    drr.push(_req(9, "d"), 1.0)
    assert "".join(r.tenant for r in _drain(drr, 1.0)) == "cdabcabc"


def test_a_push_mid_round_keeps_the_tenants_visit_in_this_round() -> None:
    drr = DeficitRoundRobin(unit=QuantumUnit.REQUESTS)
    for seq, tenant in enumerate("abc"):
        drr.push(_req(seq, tenant), 0.0)
    assert drr.pop(0.0).tenant == "a"  # type: ignore[union-attr]
    drr.push(_req(3, "c"), 0.0)  # c has not had its visit in this round yet
    drr.push(_req(4, "a"), 0.0)  # a rejoins: the start of the next round
    assert "".join(r.tenant for r in _drain(drr)) == "bcac"


def test_leaving_and_rejoining_does_not_buy_a_second_turn_in_a_round() -> None:
    drr = DeficitRoundRobin(unit=QuantumUnit.REQUESTS)
    for seq, tenant in enumerate("abcbc"):  # a has one request at a time
        drr.push(_req(seq, tenant), 0.0)
    order = []
    seq = 5
    for _ in range(6):
        request = drr.pop(1.0)
        assert request is not None
        order.append(request.tenant)
        if request.tenant == "a":  # a empties and immediately sends again
            drr.push(_req(seq, "a"), 1.0)
            seq += 1
    assert "".join(order) == "abcabc"


def test_peek_does_not_end_a_turn_and_a_declined_head_keeps_its_place() -> None:
    drr = DeficitRoundRobin({Tier.IW_NORMAL: 100})
    drr.push(_req(0, "a", tokens=60), 0.0)
    drr.push(_req(1, "a", tokens=40), 0.0)
    drr.push(_req(2, "b", tokens=100), 0.0)
    assert drr.pop(0.0) is not None
    for _ in range(3):  # the gate declines a's second head a few times
        assert drr.peek(0.0) is not None
        assert drr.peek(0.0).seq == 1  # type: ignore[union-attr]
    assert [r.seq for r in _drain(drr)] == [1, 2]


def test_charge_and_complete_change_nothing() -> None:
    drr = DeficitRoundRobin({Tier.IW_NORMAL: 100})
    first, second = _req(0, "a", 100), _req(1, "a", 100)
    drr.push(first, 0.0)
    drr.push(second, 0.0)
    drr.push(_req(2, "b", 100), 0.0)
    assert drr.pop(0.0) is first
    drr.charge(first, output_tokens=-50, input_tokens=-100, now=1.0)
    drr.complete(first, 1.0)
    assert drr.deficit("a", Tier.IW_NORMAL) == 0
    assert [r.seq for r in _drain(drr)] == [2, 1]


def test_quanta_must_be_positive_and_missing_tiers_take_defaults() -> None:
    with pytest.raises(ValueError, match="quanta"):
        DeficitRoundRobin({Tier.NIW: 0})
    assert DeficitRoundRobin({Tier.NIW: 7}).quanta == {
        Tier.IW_FAST: 4096,
        Tier.IW_NORMAL: 2048,
        Tier.NIW: 7,
    }
    assert DeficitRoundRobin(unit=QuantumUnit.REQUESTS).quanta == dict.fromkeys(Tier, 1)


def _config(ordering: Ordering) -> FairnessConfig:
    tenant = TenantConfig(weight=1.0, tier=Tier.IW_FAST, priority_factor=1.0)
    return FairnessConfig(
        source="test",
        served_model="m",
        policy=PolicyName.DRR,
        ordering=ordering,
        token_weights=TokenWeightsConfig(input=1, system=1, output=2),
        length_prediction=LengthPrediction.NONE,
        tenants={"gold": tenant},
        defaults=tenant.model_copy(update={"tier": Tier.NIW}),
        applications={},
        interaction_throttling=False,
        early_rejection=False,
        overload_kv_utilization=0.9,
        drr=DrrConfig(unit=QuantumUnit.REQUESTS, quantum={Tier.IW_FAST: 2, Tier.NIW: 1}),
        dpa=DpaConfig(severely_expired_s=2.0, urgent_within_s=0.5),
        tiers={},
        gate=GateConfig(max_waiting_requests=0, telemetry_max_age_s=5.0),
        tenant_header="x-tenant",
    )


def test_from_config_pins_tenants_and_uses_quanta_and_ordering() -> None:
    drr = DeficitRoundRobin.from_config(_config(Ordering.PRIORITY))
    assert drr.unit is QuantumUnit.REQUESTS
    assert drr.quanta == {Tier.IW_FAST: 2, Tier.IW_NORMAL: 1, Tier.NIW: 1}
    assert drr.tier_of(_req(0, "gold", tier=Tier.NIW)) is Tier.IW_FAST
    assert drr.tier_of(_req(0, "anyone", tier=Tier.IW_FAST)) is Tier.NIW  # defaults.tier
    drr.push(_req(0, "gold", tier=Tier.NIW), 0.0)
    drr.push(_req(1, "gold", deadline_s=3.0), 0.0)
    drr.push(_req(2, "gold", deadline_s=1.0), 0.0)
    assert [r.seq for r in _drain(drr)] == [2, 1, 0]
    fifo = DeficitRoundRobin.from_config(_config(Ordering.FIFO))
    for seq in (0, 1):
        fifo.push(_req(seq, "gold", tier=[Tier.NIW, Tier.IW_FAST][seq]), 0.0)
    assert [r.seq for r in _drain(fifo)] == [0, 1]


# -- properties -------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(ops, units, quanta, stable_orderings, st.booleans())
def test_dispatches_exactly_what_visit_by_visit_drr_does(
    script: Script,
    unit: QuantumUnit,
    quantum: dict[Tier, int],
    factory: Callable[[], RequestQueue],
    pinned: bool,
) -> None:
    """The round arithmetic, lazy crediting and the heap change nothing but the cost."""
    tiers = {"a": Tier.IW_FAST, "b": Tier.NIW} if pinned else None
    policy = DeficitRoundRobin(quantum, unit=unit, tiers=tiers, queue_factory=factory)
    naive = NaiveDrr(policy, factory)

    def same_state() -> None:
        deficits = {
            (tier, tenant): policy.deficit(tenant, tier)
            for tier in TIERS
            for tenant in policy.active_tenants(tier)
        }
        assert deficits == naive.deficits()

    def mirror(run: Run, request: Request | None) -> None:
        reference = naive.pop(run.now)
        assert (reference is None) == (request is None)
        assert reference is None or request is None or reference.seq == request.seq
        same_state()

    run = Run(policy, on_pop=mirror)
    original_push, original_remove = policy.push, policy.remove

    def push(request: Request, now: float) -> None:
        naive.push(request, now)
        original_push(request, now)
        same_state()

    def remove(request: Request) -> bool:
        naive.remove(request)
        removed = original_remove(request)
        same_state()
        return removed

    policy.push = push  # type: ignore[method-assign]
    policy.remove = remove  # type: ignore[method-assign]
    run.play(script)
    run.drain()


@settings(max_examples=150, deadline=None)
@given(ops, units, quanta, st.sampled_from(list(Ordering)))
def test_every_request_is_dispatched_exactly_once_and_peek_is_pop(
    script: Script,
    unit: QuantumUnit,
    quantum: dict[Tier, int],
    ordering: Ordering,
) -> None:
    run = Run(DeficitRoundRobin(quantum, unit=unit, queue_factory=queue_factory(ordering)))
    run.play(script)
    run.drain()
    assert sorted(run.dispatched + run.removed) == list(range(run.seq))
    assert run.queued == {}
    assert len(run.policy) == 0


@settings(max_examples=150, deadline=None)
@given(ops, units, quanta, st.booleans())
def test_no_lower_tier_request_goes_while_a_higher_tier_one_waits(
    script: Script, unit: QuantumUnit, quantum: dict[Tier, int], pinned: bool
) -> None:
    tiers = {"a": Tier.IW_FAST, "b": Tier.NIW} if pinned else None

    def check(run: Run, request: Request | None) -> None:
        if request is None:
            assert not run.queued
            return
        rank = TIER_RANK[run.policy.tier_of(request)]
        waiting = [TIER_RANK[run.policy.tier_of(r)] for r in run.queued.values()]
        assert rank == min(waiting)

    run = Run(DeficitRoundRobin(quantum, unit=unit, tiers=tiers), on_pop=check)
    run.play(script)
    run.drain()


@settings(max_examples=100, deadline=None)
@given(ops, units, quanta, stable_orderings, st.lists(st.booleans(), min_size=1))
def test_peeking_never_changes_what_is_dispatched(
    script: Script,
    unit: QuantumUnit,
    quantum: dict[Tier, int],
    factory: Callable[[], RequestQueue],
    peeks: list[bool],
) -> None:
    """The capacity gate may peek any number of times between pops; the schedule is the same."""
    plain = Run(DeficitRoundRobin(quantum, unit=unit, queue_factory=factory))
    peeking = Run(DeficitRoundRobin(quantum, unit=unit, queue_factory=factory))
    original = peeking.policy.push

    def push(request: Request, now: float) -> None:
        original(request, now)
        if peeks[request.seq % len(peeks)]:
            peeking.policy.peek(now)

    peeking.policy.push = push  # type: ignore[method-assign]
    for run in (plain, peeking):
        run.play(script)
        run.drain()
    assert plain.dispatched == peeking.dispatched
