"""VTC's invariants (Lemma 4.3, Lemma A.1), work conservation, weights, prediction, and LCF.

The driver below is the smallest continuous-batching engine that Algorithm 2 assumes: a memory of
M tokens; a running request holds its input plus the tokens generated so far; each decode step
generates one token per running request; new requests are selected while the head fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.api.enums import Ordering, Tier
from fleetwarden.fairness.fcfs import FirstComeFirstServed
from fleetwarden.fairness.ordering import queue_factory
from fleetwarden.fairness.request import Request
from fleetwarden.fairness.vtc import LeastCounterFirst, TokenPrices, VirtualTokenCounter

MEMORY = 600
MAX_INPUT = 200
MAX_OUTPUT = 120


@dataclass
class MiniEngine:
    """Continuous batching as Algorithm 2 describes it; checks invariants after every change."""

    policy: VirtualTokenCounter
    weights: dict[str, float] = field(default_factory=dict)
    running: list[Request] = field(default_factory=list)
    lengths: dict[int, int] = field(default_factory=dict)
    now: float = 0.0
    seq: int = 0
    min_counter_history: list[float] = field(default_factory=list)

    @property
    def bound(self) -> float:
        prices = self.policy.prices
        return max(prices.input * MAX_INPUT, prices.output * MEMORY) / min(
            [*self.weights.values(), 1.0]
        )

    def used(self) -> int:
        return sum(r.input_tokens + r.output_tokens for r in self.running)

    def arrive(self, tenant: str, input_tokens: int, output_tokens: int) -> None:
        request = Request(self.seq, tenant, self.now, input_tokens, max_output_tokens=output_tokens)
        self.lengths[self.seq] = output_tokens
        self.seq += 1
        self.policy.push(request, self.now)
        self.check()

    def admit(self) -> None:
        while (head := self.policy.peek(self.now)) is not None:
            if head.input_tokens + 1 > MEMORY - self.used():
                break
            popped = self.policy.pop(self.now)
            assert popped is head  # work conservation: the admitted head is what is dispatched
            self.running.append(head)
            self.check()

    def decode(self) -> None:
        self.now += 1.0
        for request in list(self.running):
            self.policy.charge(request, output_tokens=1, now=self.now)
            request.output_tokens += 1
            if request.output_tokens >= self.lengths[request.seq]:
                self.running.remove(request)
                self.policy.complete(request, self.now)
        self.check()

    def check(self) -> None:
        queued = self.policy.queued_tenants()
        if not queued:
            self.min_counter_history.clear()
            return
        counters = [self.policy.counters[t] for t in queued]
        assert max(counters) - min(counters) <= self.bound + 1e-9, (counters, self.bound)
        self.min_counter_history.append(min(counters))


events = st.lists(
    st.one_of(
        st.tuples(
            st.just("arrive"),
            st.sampled_from(["a", "b", "c", "d"]),
            st.integers(1, MAX_INPUT),
            st.integers(1, MAX_OUTPUT),
        ),
        st.tuples(st.just("step"), st.integers(1, 8)),
    ),
    min_size=1,
    max_size=120,
)


def _run(engine: MiniEngine, script: list[tuple[object, ...]]) -> None:
    for event in script:
        if event[0] == "arrive":
            _, tenant, n_in, n_out = event
            engine.arrive(str(tenant), int(n_in), int(n_out))  # type: ignore[call-overload]
        else:
            for _ in range(int(event[1])):  # type: ignore[call-overload]
                engine.admit()
                engine.decode()


@settings(max_examples=200, deadline=None)
@given(events)
def test_counter_gap_among_queued_tenants_is_bounded(script: list[tuple[object, ...]]) -> None:
    """Lemma 4.3: max - min counter over queued tenants <= max(w_p L_input, w_q M)."""
    _run(MiniEngine(VirtualTokenCounter(TokenPrices(1.0, 2.0))), script)


@settings(max_examples=200, deadline=None)
@given(events)
def test_min_counter_over_queued_tenants_never_decreases(script: list[tuple[object, ...]]) -> None:
    """Lemma A.1, while the queue stays non-empty."""
    engine = MiniEngine(VirtualTokenCounter())
    original = engine.check

    def check() -> None:
        original()
        history = engine.min_counter_history
        if len(history) >= 2:
            assert history[-1] >= history[-2] - 1e-9

    engine.check = check  # type: ignore[method-assign]
    _run(engine, script)


@settings(max_examples=150, deadline=None)
@given(events, st.sampled_from([{"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}, {"a": 0.5, "b": 1.0}]))
def test_weighted_counters_keep_the_bound(
    script: list[tuple[object, ...]], weights: dict[str, float]
) -> None:
    """Weighted VTC: the same invariant holds on weighted counters (bound / min weight)."""
    engine = MiniEngine(VirtualTokenCounter(weights=weights), weights=weights)
    _run(engine, script)


def test_lift_on_rejoin_is_to_the_least_queued_counter() -> None:
    vtc = VirtualTokenCounter(TokenPrices(1.0, 2.0))
    vtc.push(Request(0, "a", 0.0, 100, 10), 0.0)
    vtc.push(Request(1, "b", 0.0, 50, 10), 0.0)
    vtc.push(Request(2, "b", 0.0, 50, 10), 0.0)
    first = vtc.pop(0.0)
    assert first is not None
    assert first.tenant == "a"  # tie at 0: the earliest arrival
    vtc.charge(first, output_tokens=30, now=1.0)  # a: 100 + 60 = 160
    assert vtc.pop(1.0) is not None  # b: 50
    # c arrives while b is queued (counter 50): lifted from 0 to 50, not to a's 160.
    vtc.push(Request(3, "c", 1.0, 10, 10), 1.0)
    assert vtc.counters["c"] == 50.0


def test_lift_on_an_empty_queue_is_to_the_last_tenant_to_leave() -> None:
    vtc = VirtualTokenCounter(TokenPrices(1.0, 2.0))
    vtc.push(Request(0, "a", 0.0, 100, 10), 0.0)
    request = vtc.pop(0.0)
    assert request is not None
    vtc.charge(request, output_tokens=10, now=1.0)  # a = 120, and a left the queue last
    vtc.push(Request(1, "b", 2.0, 10, 10), 2.0)
    assert vtc.counters["b"] == 120.0
    # A tenant that was ahead keeps its counter: the lift is a max, never a reset.
    vtc.counters["c"] = 500.0
    vtc.push(Request(2, "c", 2.0, 10, 10), 2.0)
    assert vtc.counters["c"] == 500.0


def test_least_counter_first_does_not_lift() -> None:
    lcf = LeastCounterFirst()
    lcf.push(Request(0, "a", 0.0, 100, 10), 0.0)
    lcf.pop(0.0)
    lcf.push(Request(1, "b", 1.0, 10, 10), 1.0)
    assert lcf.counters["b"] == 0.0


def test_prediction_charges_at_dispatch_and_settles_on_completion() -> None:
    vtc = VirtualTokenCounter(TokenPrices(1.0, 2.0), predict=lambda r: r.predicted_output_tokens)
    over = Request(0, "a", 0.0, 10, 100, predicted_output_tokens=5)
    under = Request(1, "b", 0.0, 10, 100, predicted_output_tokens=50)
    for request in (over, under):
        vtc.push(request, 0.0)
    for _ in range(2):
        vtc.pop(0.0)
    assert vtc.counters == {"a": 10 + 2 * 5, "b": 10 + 2 * 50}
    for request in (over, under):
        for _ in range(8):  # 8 tokens each
            vtc.charge(request, output_tokens=1, now=1.0)
            request.output_tokens += 1
        vtc.complete(request, 2.0)
    assert vtc.counters["a"] == 10 + 2 * 8  # excess 3 tokens charged as they came
    assert vtc.counters["b"] == 10 + 2 * 8  # 42 unused predicted tokens refunded


def test_input_corrections_are_charged() -> None:
    vtc = VirtualTokenCounter(TokenPrices(1.0, 2.0))
    request = Request(0, "a", 0.0, 100, 10)
    vtc.push(request, 0.0)
    vtc.pop(0.0)
    vtc.charge(request, input_tokens=-20, now=0.5)  # the engine counted 80 prompt tokens
    assert vtc.counters["a"] == 80.0


def test_remove_cancels_a_queued_request_and_its_tenant_may_leave() -> None:
    vtc = VirtualTokenCounter()
    a, b = Request(0, "a", 0.0, 10, 10), Request(1, "b", 0.0, 10, 10)
    vtc.push(a, 0.0)
    vtc.push(b, 0.0)
    assert vtc.remove(a)
    assert not vtc.remove(a)
    assert len(vtc) == 1
    assert vtc.queued_tenants() == ["b"]
    assert vtc.pop(0.0) is b
    assert vtc.pop(0.0) is None


@pytest.mark.parametrize("ordering", list(Ordering))
def test_every_ordering_drains_every_request_exactly_once(ordering: Ordering) -> None:
    policies = [
        VirtualTokenCounter(queue_factory=queue_factory(ordering)),
        FirstComeFirstServed(queue_factory(ordering)),
    ]
    for policy in policies:
        requests = [
            Request(
                i, f"t{i % 3}", float(i), 10, 10, tier=list(Tier)[i % 3], deadline_s=float(20 - i)
            )
            for i in range(12)
        ]
        for request in requests:
            policy.push(request, request.arrival_s)
        policy.remove(requests[4])
        seen = []
        while (request := policy.pop(30.0)) is not None:
            seen.append(request.seq)
        assert sorted(seen) == [i for i in range(12) if i != 4]
        assert len(policy) == 0


def test_least_counter_first_breaks_the_bound_on_on_off_load_and_vtc_keeps_it() -> None:
    """The negative control: a tenant back from idle under LCF has a counter far below the rest."""
    script: list[tuple[object, ...]] = [("arrive", "a", 100, 100) for _ in range(6)]
    script += [("step", 8)] * 40  # a alone: its counter grows far past the bound
    script += [("arrive", "a", 100, 100), ("arrive", "a", 100, 100), ("arrive", "b", 100, 100)]
    with pytest.raises(AssertionError):
        _run(MiniEngine(LeastCounterFirst()), script)
    _run(MiniEngine(VirtualTokenCounter()), script)
