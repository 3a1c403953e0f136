"""`push_pop` (a request into an empty policy, dispatched at once) against `push` then `pop`.

The simulator calls `push_pop` whenever a request finds its pod's queue empty and the engine free
(the usual case below saturation), so it must leave VTC and WSC exactly as the two calls would:
the same counters, float for float, and the same decisions afterwards, under lifts, charges,
prediction refunds and every ordering (DPA's heads move with time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.api.enums import Ordering, Tier
from fleetwarden.fairness.ordering import queue_factory
from fleetwarden.fairness.request import Request
from fleetwarden.fairness.vtc import LeastCounterFirst, TokenPrices, VirtualTokenCounter
from fleetwarden.fairness.wsc import ServiceWeights, WeightedServiceCounter
from tests.fairness.test_fast_paths import STAGES, script_requests

Policy = VirtualTokenCounter | WeightedServiceCounter

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("arrive"),
            st.sampled_from("abcd"),
            st.integers(1, 40),  # input tokens
            st.integers(0, 60),  # system tokens (capped at the input)
            st.sampled_from(list(Tier)),
            st.one_of(st.none(), st.floats(0, 20)),  # deadline
            st.booleans(),  # continuation
            st.one_of(st.none(), st.integers(0, 40)),  # predicted output
        ),
        st.tuples(st.just("pop"), st.integers(1, 3)),
        st.tuples(st.just("charge"), st.integers(0, 300), st.integers(0, 30)),
        st.tuples(st.just("complete"), st.integers(0, 300)),
        st.tuples(st.just("tick"), st.floats(0, 2)),
    ),
    min_size=20,
    max_size=100,
)


def _drive(fast: Policy, slow: Policy, script: list[tuple[Any, ...]]) -> None:
    """Arrivals into an empty policy go through `push_pop` on `fast` and `push` + `pop` on
    `slow`; everything else is the same call on both."""
    now, seq = 0.0, 0
    mine: dict[int, Request] = {}
    theirs: dict[int, Request] = {}
    running: list[int] = []
    for op in script:
        if op[0] == "arrive":
            mine[seq], theirs[seq] = script_requests(op, seq, now)
            if len(fast) == 0:
                fast.push_pop(mine[seq], now)
                slow.push(theirs[seq], now)
                assert slow.pop(now) is theirs[seq]
                running.append(seq)
            else:
                fast.push(mine[seq], now)
                slow.push(theirs[seq], now)
            seq += 1
        elif op[0] == "pop":
            for _ in range(op[1]):
                got, want = fast.pop(now), slow.pop(now)
                assert (got and got.seq) == (want and want.seq)
                if got is not None:
                    running.append(got.seq)
        elif op[0] == "charge" and running:
            s = running[op[1] % len(running)]
            fast.charge(mine[s], output_tokens=op[2], now=now)
            slow.charge(theirs[s], output_tokens=op[2], now=now)
            mine[s].output_tokens += op[2]
            theirs[s].output_tokens += op[2]
        elif op[0] == "complete" and running:
            s = running.pop(op[1] % len(running))
            fast.complete(mine[s], now)
            slow.complete(theirs[s], now)
        elif op[0] == "tick":
            now += op[1]
        assert fast.counters == slow.counters
        assert len(fast) == len(slow)
    while (got := fast.pop(now)) is not None:
        want = slow.pop(now)
        assert want is not None
        assert got.seq == want.seq
    assert slow.pop(now) is None


@settings(max_examples=100, deadline=None)
@given(
    ops, st.sampled_from(list(Ordering)), st.sampled_from(["plain", "weighted", "predict", "lcf"])
)
def test_vtc_push_pop_is_push_then_pop(
    script: list[tuple[Any, ...]], ordering: Ordering, variant: str
) -> None:
    def make() -> VirtualTokenCounter:
        prices = TokenPrices(1.5, 3.0) if variant == "weighted" else TokenPrices(1.0, 2.0)
        predict: Callable[[Request], int | None] | None = (
            (lambda r: r.predicted_output_tokens) if variant == "predict" else None
        )
        cls = LeastCounterFirst if variant == "lcf" else VirtualTokenCounter
        weights = {"a": 2.0, "c": 0.5} if variant == "weighted" else None
        return cls(prices, weights=weights, predict=predict, queue_factory=queue_factory(ordering))

    _drive(make(), make(), script)


@settings(max_examples=100, deadline=None)
@given(ops, st.sampled_from(list(Ordering)), st.booleans())
def test_wsc_push_pop_is_push_then_pop(
    script: list[tuple[Any, ...]], ordering: Ordering, configured: bool
) -> None:
    def make() -> WeightedServiceCounter:
        if configured:
            return WeightedServiceCounter(
                ServiceWeights(1, 3, 2),
                stages=STAGES,
                priority_factors={"b": 0.5},
                weights={"a": 2.0, "c": 0.5},
                queue_factory=queue_factory(ordering),
            )
        return WeightedServiceCounter(queue_factory=queue_factory(ordering))

    _drive(make(), make(), script)


@pytest.mark.parametrize("make", [VirtualTokenCounter, WeightedServiceCounter])
def test_push_pop_refuses_a_non_empty_policy(make: Callable[[], Policy]) -> None:
    policy = make()
    policy.push(Request(0, "a", 0.0, 10, 10), 0.0)
    with pytest.raises(ValueError, match="empty policy"):
        policy.push_pop(Request(1, "b", 0.0, 10, 10), 0.0)
