"""`backlog_index.OwnOrder`, the treap early rejection keeps each tenant's queue in: against a
sorted scan, independent of history, and shallow when keys arrive in order."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.api.enums import Tier
from fleetwarden.fairness.admission import request_work
from fleetwarden.fairness.backlog_index import OwnOrder
from fleetwarden.fairness.request import Request


def req(seq: int, inp: int, deadline: float | None) -> Request:
    return Request(seq, "me", 1.0, inp, 10, tier=Tier.IW_NORMAL, deadline_s=deadline)


def _own_key(request: Request) -> tuple[float, ...]:
    return (math.inf if request.deadline_s is None else request.deadline_s,)


def _depth(node: Any) -> int:
    return 0 if node is None else 1 + max(_depth(node.left), _depth(node.right))


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.booleans(), st.integers(0, 30), st.none() | st.sampled_from([1.0, 2.0, 3.0])),
        max_size=80,
    ),
    probes=st.lists(st.tuples(st.integers(0, 60), st.none() | st.floats(0.0, 4.0)), max_size=5),
)
def test_own_order_matches_a_sorted_scan(
    ops: list[tuple[bool, int, float | None]], probes: list[tuple[int, float | None]]
) -> None:
    """Adds, removals (of queued and of absent requests alike) and equal deadlines: the work
    ahead is always the scan's, ties broken by arrival, and the tree's shape depends only on
    what is queued, never on the order it came in (priorities are hashed from the seq)."""
    order, replay, queued = OwnOrder(_own_key), OwnOrder(_own_key), {}
    for add, seq, deadline in ops:
        request = req(seq, seq, deadline)
        if add and seq not in queued:
            queued[seq] = request
            order.change(Tier.IW_NORMAL, request, request_work(request))
        elif not add:
            known = queued.pop(seq, None)  # an absent seq is removed too: it must change nothing
            order.change(Tier.IW_NORMAL, known or request, None)
    for seq, deadline in probes:
        probe = req(100 + seq, 0, deadline)
        key = (*_own_key(probe), probe.seq)
        scan = sum(request_work(r) for r in queued.values() if (*_own_key(r), r.seq) < key)
        assert order.ahead(Tier.IW_NORMAL, probe) == scan
    for request in sorted(queued.values(), key=lambda r: -r.seq):
        replay.change(Tier.IW_NORMAL, request, request_work(request))

    def shape(node: Any) -> Any:
        return None if node is None else (node.key, node.total, shape(node.left), shape(node.right))

    scope = ("me", Tier.IW_NORMAL)
    assert shape(order._roots.get(scope)) == shape(replay._roots.get(scope))


def test_own_order_stays_shallow_when_deadlines_follow_arrival() -> None:
    """Deadlines in arrival order (every tenant's default: now + its target) would make a plain
    search tree a list; the treap's hashed priorities keep it O(log n) deep, and after removing
    most of it too."""
    order = OwnOrder(_own_key)
    requests = [req(seq, 1, float(seq)) for seq in range(20_000)]
    for request in requests:
        order.change(Tier.IW_NORMAL, request, 1)
    assert _depth(order._roots[("me", Tier.IW_NORMAL)]) <= 4 * math.log2(len(requests))
    for request in requests[::3] + requests[1::3]:
        order.change(Tier.IW_NORMAL, request, None)
    root = order._roots[("me", Tier.IW_NORMAL)]
    assert root.total == len(requests[2::3])
    assert _depth(root) <= 4 * math.log2(len(requests))
    probe = req(99_999, 0, 10_000.5)
    assert order.ahead(Tier.IW_NORMAL, probe) == sum(1 for r in requests[2::3] if r.seq <= 10_000)
