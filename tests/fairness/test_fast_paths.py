"""The heaps behind VTC and WSC against scans, and the queues' fast paths.

VTC and WSC keep lazily keyed heaps (an entry's counter is a lower bound, re-keyed when it reaches
the top; a dispatch replaces the top in place; stale entries are dropped or compacted away). The
references below do the same accounting but select by scanning every queued tenant, which is
what the heaps must reproduce exactly: the same dispatch order and the same counters, float for
float, under pushes, dispatches, per-token charges, negative corrections, prediction refunds,
cancellations and lifts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.api.enums import Ordering, QuantumUnit, Tier
from fleetwarden.fairness.drr import (
    DeficitRoundRobin,
    priority_deadline_key,
    priority_deadline_queue,
)
from fleetwarden.fairness.ordering import FifoQueue, KeyedQueue, RequestQueue, queue_factory
from fleetwarden.fairness.request import Request
from fleetwarden.fairness.vtc import LeastCounterFirst, TokenPrices, VirtualTokenCounter
from fleetwarden.fairness.wsc import ServiceWeights, WeightedServiceCounter

ORDERINGS = [Ordering.FIFO, Ordering.PRIORITY, Ordering.EDF]
"""Orderings whose head depends on the queue's content only (DPA's moves with time)."""
WEIGHTS = {"a": 2.0, "c": 0.5}
Script = list[tuple[Any, ...]]
STAGES = {"chat": {"ask": {"input": 20, "system": 10, "output": 40}}}
"""The one application stage scripted requests name (every other one): `script_requests`."""


class ScanVtc:
    """VTC's accounting with selection by a scan over the queued tenants."""

    def __init__(
        self,
        prices: TokenPrices,
        weights: dict[str, float] | None,
        predict: Callable[[Request], int | None] | None,
        factory: Callable[[], RequestQueue],
        lift: bool,
    ) -> None:
        self.prices, self.weights, self.predict, self.factory, self.lift = (
            prices,
            weights,
            predict,
            factory,
            lift,
        )
        self.counters: dict[str, float] = {}
        self.queues: dict[str, RequestQueue] = {}
        self.last_left: str | None = None
        self.predicted: dict[int, int] = {}

    def weight(self, tenant: str) -> float:
        return 1.0 if self.weights is None else self.weights.get(tenant, 1.0)

    def queued(self) -> list[str]:
        return [t for t, q in self.queues.items() if len(q)]

    def push(self, request: Request, now: float) -> None:
        tenant = request.tenant
        self.counters.setdefault(tenant, 0.0)
        queue = self.queues.setdefault(tenant, self.factory())
        if self.lift and not len(queue):
            queued = self.queued()
            if queued:
                floor: float | None = min(self.counters[t] for t in queued)
            else:
                floor = None if self.last_left is None else self.counters[self.last_left]
            if floor is not None:
                self.counters[tenant] = max(self.counters[tenant], floor)
        queue.push(request)

    def pop(self, now: float) -> Request | None:
        queued = self.queued()
        if not queued:
            return None

        def key(tenant: str) -> tuple[float, int]:
            head = self.queues[tenant].head(now)
            assert head is not None
            return self.counters[tenant], head.seq

        tenant = min(queued, key=key)
        request = self.queues[tenant].pop(now)
        self.last_left = tenant
        cost = self.prices.input * request.input_tokens
        if self.predict is not None:
            predicted = max(0, self.predict(request) or 0)
            self.predicted[request.seq] = predicted
            cost += self.prices.output * predicted
        self.counters[tenant] += cost / self.weight(tenant) if self.weights is not None else cost
        return request

    def charge(self, request: Request, input_tokens: int, output_tokens: int) -> None:
        billable = output_tokens
        predicted = self.predicted.get(request.seq)
        if predicted is not None:
            before, after = request.output_tokens, request.output_tokens + output_tokens
            billable = max(0, after - predicted) - max(0, before - predicted)
        cost = self.prices.input * input_tokens + self.prices.output * billable
        if cost:
            if self.weights is not None:
                cost /= self.weight(request.tenant)
            self.counters[request.tenant] = self.counters.get(request.tenant, 0.0) + cost

    def complete(self, request: Request) -> None:
        predicted = self.predicted.pop(request.seq, None)
        if predicted is None or request.output_tokens >= predicted:
            return
        refund = self.prices.output * (predicted - request.output_tokens)
        self.counters[request.tenant] -= refund / self.weight(request.tenant)

    def remove(self, request: Request) -> bool:
        queue = self.queues.get(request.tenant)
        return queue is not None and queue.remove(request)


class ScanWsc:
    """WSC's accounting (the policy's own scale) with selection by a scan: continuations first."""

    def __init__(self, policy: WeightedServiceCounter, factory: Callable[[], RequestQueue]) -> None:
        self.policy, self.factory = policy, factory  # the policy: for `_scale` only
        self.counters: dict[str, float] = {}
        self.queues: dict[tuple[str, bool], RequestQueue] = {}
        self.last_left: str | None = None

    def queued(self) -> set[str]:
        return {t for (t, _), q in self.queues.items() if len(q)}

    def push(self, request: Request, now: float) -> None:
        tenant = request.tenant
        self.counters.setdefault(tenant, 0.0)
        queued = self.queued()
        if tenant not in queued:
            if queued:
                floor: float | None = min(self.counters[t] for t in queued)
            else:
                floor = None if self.last_left is None else self.counters[self.last_left]
            if floor is not None:
                self.counters[tenant] = max(self.counters[tenant], floor)
        self.queues.setdefault((tenant, request.continuation), self.factory()).push(request)

    def pop(self, now: float) -> Request | None:
        for continuation in (True, False):
            keys = [k for k, q in self.queues.items() if k[1] is continuation and len(q)]
            if not keys:
                continue

            def order(key: tuple[str, bool]) -> tuple[float, int]:
                head = self.queues[key].head(now)
                assert head is not None
                return self.counters[key[0]], head.seq

            key = min(keys, key=order)
            request = self.queues[key].pop(now)
            self.last_left = key[0]
            tw = self.policy.token_weights
            weighted = tw.input * max(0, request.user_input_tokens) + tw.system * (
                request.system_tokens
            )
            self.counters[key[0]] += weighted * self.policy._scale(request)
            return request
        return None

    def charge(self, request: Request, input_tokens: int, output_tokens: int) -> None:
        tw = self.policy.token_weights
        weighted = tw.input * input_tokens + tw.output * output_tokens
        if weighted:
            amount = weighted * self.policy._scale(request)
            self.counters[request.tenant] = self.counters.get(request.tenant, 0.0) + amount

    def remove(self, request: Request) -> bool:
        return any(q.remove(request) for (t, _), q in self.queues.items() if t == request.tenant)


# -- scripts --------------------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("push"),
            st.sampled_from("abcde"),
            st.integers(0, 40),  # input tokens: charges must be able to reorder tenants
            st.integers(0, 60),  # system tokens (capped at the input)
            st.sampled_from(list(Tier)),
            st.one_of(st.none(), st.floats(0, 20)),  # deadline
            st.booleans(),  # continuation (WSC only)
            st.one_of(st.none(), st.integers(0, 40)),  # predicted output
        ),
        st.tuples(st.just("pop"), st.integers(1, 3)),
        st.tuples(
            st.just("charge"),
            st.integers(0, 300),  # which running request
            st.one_of(st.just(0), st.integers(-10, 10)),  # input correction
            st.integers(0, 30),  # generated tokens
        ),
        st.tuples(st.just("complete"), st.integers(0, 300)),
        st.tuples(st.just("remove"), st.integers(0, 300)),
        st.tuples(st.just("tick"), st.floats(0, 2)),
    ),
    min_size=30,
    max_size=120,
)


def script_requests(op: tuple[Any, ...], seq: int, now: float) -> tuple[Request, Request]:
    """The request an arrival op (a `push` here, an `arrive` in `test_push_pop`) describes, and an
    equal copy for the policy it is checked against: odd seqs are in `STAGES`' chat stage."""
    _, tenant, tokens, system, tier, deadline, continuation, predicted = op
    request = Request(
        seq,
        tenant,
        now,
        tokens,
        64,
        system_tokens=min(system, tokens),
        app="chat" if seq % 2 else None,
        stage="ask" if seq % 2 else None,
        continuation=continuation,
        tier=tier,
        deadline_s=deadline,
        predicted_output_tokens=predicted,
    )
    return request, replace(request)


def _run(
    policy: VirtualTokenCounter | WeightedServiceCounter, ref: ScanVtc | ScanWsc, script: Script
) -> None:
    now, seq = 0.0, 0
    mine: dict[int, Request] = {}
    theirs: dict[int, Request] = {}
    running: list[int] = []
    for op in script:
        if op[0] == "push":
            mine[seq], theirs[seq] = script_requests(op, seq, now)
            policy.push(mine[seq], now)
            ref.push(theirs[seq], now)
            seq += 1
        elif op[0] == "pop":
            for _ in range(op[1]):
                got, want = policy.pop(now), ref.pop(now)
                assert (got and got.seq) == (want and want.seq)
                if got is not None:
                    running.append(got.seq)
        elif op[0] == "charge" and running:
            _, pick, input_tokens, output_tokens = op
            s = running[pick % len(running)]
            policy.charge(mine[s], input_tokens=input_tokens, output_tokens=output_tokens, now=now)
            ref.charge(theirs[s], input_tokens, output_tokens)
            mine[s].output_tokens += output_tokens
            theirs[s].output_tokens += output_tokens
        elif op[0] == "complete" and running:
            s = running.pop(op[1] % len(running))
            policy.complete(mine[s], now)
            if isinstance(ref, ScanVtc):
                ref.complete(theirs[s])
        elif op[0] == "remove" and seq:
            s = op[1] % seq
            assert policy.remove(mine[s]) == ref.remove(theirs[s])
        elif op[0] == "tick":
            now += op[1]
        assert policy.counters == ref.counters
        assert len(policy) == sum(len(q) for q in ref.queues.values())
    while (got := policy.pop(now)) is not None:
        want = ref.pop(now)
        assert want is not None
        assert got.seq == want.seq
    assert ref.pop(now) is None


@settings(max_examples=100, deadline=None)
@given(
    ops,
    st.sampled_from(ORDERINGS),
    st.sampled_from(["plain", "weighted", "predict", "lcf"]),
)
def test_vtc_heap_selects_what_a_scan_selects(
    script: Script, ordering: Ordering, variant: str
) -> None:
    factory = queue_factory(ordering)
    prices = TokenPrices(1.0, 2.0) if variant != "weighted" else TokenPrices(1.5, 3.0)
    weights = WEIGHTS if variant == "weighted" else None
    predict = (lambda r: r.predicted_output_tokens) if variant == "predict" else None
    cls = LeastCounterFirst if variant == "lcf" else VirtualTokenCounter
    policy = cls(prices, weights=weights, predict=predict, queue_factory=factory)
    _run(policy, ScanVtc(prices, weights, predict, factory, lift=variant != "lcf"), script)


@settings(max_examples=100, deadline=None)
@given(ops, st.sampled_from(ORDERINGS), st.booleans())
def test_wsc_heaps_select_what_a_scan_selects(
    script: Script, ordering: Ordering, configured: bool
) -> None:
    factory = queue_factory(ordering)
    if configured:
        policy = WeightedServiceCounter(
            ServiceWeights(1, 3, 2),
            stages=STAGES,
            priority_factors={"b": 0.5},
            weights=WEIGHTS,
            queue_factory=factory,
        )
    else:
        policy = WeightedServiceCounter(queue_factory=factory)
    _run(policy, ScanWsc(policy, factory), script)


def test_stale_entries_are_compacted_without_changing_decisions() -> None:
    """Negative corrections re-file a queued tenant each time; the stale entries they leave are
    compacted away (the heap stays bounded) and selection still matches the scan."""
    prices = TokenPrices()
    policy = VirtualTokenCounter(prices)
    ref = ScanVtc(prices, None, None, FifoQueue, lift=True)
    requests = [Request(i, "abc"[i % 3], 0.0, 10 + i, 8) for i in range(30)]
    for request in requests:
        policy.push(request, 0.0)
        ref.push(replace(request), 0.0)
    first, want = policy.pop(0.0), ref.pop(0.0)
    assert first is not None
    assert want is not None
    assert first.seq == want.seq
    for _ in range(3000):  # each is a re-file of tenant "a", which is still queued
        policy.charge(first, input_tokens=-1, now=0.0)
        ref.charge(first, -1, 0)
    assert len(policy._heap) <= 2 * 3 + 1024 + 1
    assert policy.counters == ref.counters
    while (got := policy.pop(1.0)) is not None:
        want = ref.pop(1.0)
        assert want is not None
        assert got.seq == want.seq


# -- the queues -------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [FifoQueue, lambda: KeyedQueue(priority_deadline_key)])
def test_removal_marks_are_dropped_once_cleaned(make: Callable[[], RequestQueue]) -> None:
    queue = make()
    requests = [Request(i, "t", 0.0, 1, 1) for i in range(4)]
    for request in requests:
        queue.push(request)
    assert queue.remove(requests[0])
    assert queue.remove(requests[2])
    assert not queue.remove(requests[0])  # already gone
    assert len(queue) == 2
    assert queue.pop(0.0) is requests[1]  # cleans the mark of 0
    assert queue.pop(0.0) is requests[3]  # cleans the mark of 2
    assert queue.head(0.0) is None
    assert len(queue) == 0
    assert getattr(queue, "_removed", "missing") is None  # no set is kept while none is pending


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.just("push"),
                st.sampled_from(list(Tier)),
                st.one_of(st.none(), st.integers(-3, 3).map(float)),  # ties on purpose
            ),
            st.tuples(st.just("pop")),
            st.tuples(st.just("remove"), st.integers(0, 60)),
        ),
        max_size=60,
    )
)
def test_keyed_queues_pop_in_key_order_through_runs_and_heaps(script: Script) -> None:
    """A sorted run while pushes come in key order, a heap after one does not: the order is
    always the least (key, seq) first, with removals, for the inline and the generic queue."""
    fast, generic = priority_deadline_queue(), KeyedQueue(priority_deadline_key)
    queued: dict[int, Request] = {}
    pushed: list[Request] = []
    for op in script:
        if op[0] == "push":
            request = Request(len(pushed), "t", 0.0, 1, 1, tier=op[1], deadline_s=op[2])
            pushed.append(request)
            queued[request.seq] = request
            fast.push(request)
            generic.push(request)
        elif op[0] == "pop" and queued:
            want = min(queued.values(), key=lambda r: (*priority_deadline_key(r), r.seq))
            assert fast.head(0.0) is want
            assert generic.head(0.0) is want
            assert fast.pop(0.0) is want
            assert generic.pop(0.0) is want
            del queued[want.seq]
        elif op[0] == "remove" and pushed:
            request = pushed[op[1] % len(pushed)]
            assert fast.remove(request) == (request.seq in queued)
            assert generic.remove(request) == (request.seq in queued)
            queued.pop(request.seq, None)
        assert len(fast) == len(generic) == len(queued)
    for want in sorted(queued.values(), key=lambda r: (*priority_deadline_key(r), r.seq)):
        assert fast.pop(0.0) is want
        assert generic.pop(0.0) is want
    assert fast.head(0.0) is None
    assert generic.head(0.0) is None


# -- DRR's fused default queue -----------------------------------------------------------------

drr_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("push"),
            st.sampled_from("abcd"),
            st.integers(0, 400),  # prompt tokens
            st.integers(0, 300),  # output budget
            st.sampled_from(list(Tier)),
            st.one_of(st.none(), st.integers(-2, 2).map(float)),  # deadline ties on purpose
            st.booleans(),  # a seq below every earlier one (the shell's order is not ours)
        ),
        st.tuples(st.just("pop"), st.integers(1, 4)),
        st.tuples(st.just("peek")),
        st.tuples(st.just("remove"), st.integers(0, 300)),
    ),
    min_size=20,
    max_size=150,
)


@settings(max_examples=150, deadline=None)
@given(drr_ops, st.sampled_from(list(QuantumUnit)), st.booleans())
def test_drr_fused_queue_decides_as_the_generic_keyed_queue(
    script: Script, unit: QuantumUnit, pinned: bool
) -> None:
    quanta = {Tier.IW_FAST: 300, Tier.IW_NORMAL: 200, Tier.NIW: 100}
    if unit is QuantumUnit.REQUESTS:
        quanta = {Tier.IW_FAST: 2, Tier.IW_NORMAL: 1, Tier.NIW: 1}
    tiers = {"a": Tier.IW_FAST, "b": Tier.NIW} if pinned else None
    fast = DeficitRoundRobin(quanta, unit=unit, tiers=tiers)
    generic = DeficitRoundRobin(
        quanta, unit=unit, tiers=tiers, queue_factory=lambda: KeyedQueue(priority_deadline_key)
    )
    mine: list[Request] = []
    theirs: list[Request] = []
    now = 0.0
    for op in script:
        now += 0.01
        if op[0] == "push":
            _, tenant, prompt, budget, tier, deadline, early = op
            seq = 1999 - 2 * len(mine) if early else 2000 + 2 * len(mine)  # unique
            request = Request(seq, tenant, now, prompt, budget, tier=tier, deadline_s=deadline)
            mine.append(request)
            theirs.append(replace(request))
            fast.push(mine[-1], now)
            generic.push(theirs[-1], now)
        elif op[0] == "pop":
            for _ in range(op[1]):
                got, want = fast.pop(now), generic.pop(now)
                assert (got and got.seq) == (want and want.seq)
        elif op[0] == "peek":
            got, want = fast.peek(now), generic.peek(now)
            assert (got and got.seq) == (want and want.seq)
        elif op[0] == "remove" and mine:
            index = op[1] % len(mine)
            assert fast.remove(mine[index]) == generic.remove(theirs[index])
        assert len(fast) == len(generic)
        for tier in Tier:
            tenants = fast.active_tenants(tier)
            assert tenants == generic.active_tenants(tier)
            for tenant in tenants:
                assert fast.deficit(tenant, tier) == generic.deficit(tenant, tier)
    while (got := fast.pop(now)) is not None:
        want = generic.pop(now)
        assert want is not None
        assert got.seq == want.seq
    assert generic.pop(now) is None
