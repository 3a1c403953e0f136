"""The queues inside a DRR tenant: priority, then deadline, then arrival (the blog's third
selector), as DRR's default ordering.

`priority_deadline_queue` is the general `RequestQueue` for it (any policy may use it);
`CostedQueue` is the same order fused with DRR's per-flow cost table, which only DRR builds (see
its docstring for why). Both order exactly as `KeyedQueue(priority_deadline_key)`;
`tests/fairness/test_fast_paths.py` checks that.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any

from fleetwarden.fairness.ordering import KeyedQueue, RequestQueue
from fleetwarden.fairness.request import TIER_RANK, Request

_NO_DEADLINE = math.inf


def priority_deadline_key(request: Request) -> tuple[float, ...]:
    """Tier priority first, then the earliest deadline (none: last); `KeyedQueue` adds arrival."""
    deadline = _NO_DEADLINE if request.deadline_s is None else request.deadline_s
    return (TIER_RANK[request.tier], deadline)  # `request.tier_rank`, without a property call


def _deadline(request: Request) -> float:
    deadline = request.deadline_s
    return _NO_DEADLINE if deadline is None else deadline


class _PriorityDeadlineQueue(KeyedQueue):
    """`KeyedQueue(priority_deadline_key)` with its entries built inline: DRR's default ordering,
    and one entry is built per request pushed (the same entries, without a call and a key tuple)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(priority_deadline_key)

    def _entry(self, request: Request) -> tuple[Any, ...]:
        deadline = request.deadline_s
        rank = TIER_RANK[request.tier]
        return (rank, _NO_DEADLINE if deadline is None else deadline, request.seq, request)


def priority_deadline_queue() -> RequestQueue:
    return _PriorityDeadlineQueue()


class CostedQueue:
    """DRR's own queue for its default ordering: `_PriorityDeadlineQueue`'s order, with the
    costs table of its flow (`costs`, seq -> cost, which DRR fills and empties) as its membership.

    Why a third class: at 10,000 tenants a decision's cost is mostly memory traffic, calls and
    allocations. The general queue keeps a membership set beside the flow's cost table (one more
    object per tenant, touched on every push and pop) and builds an entry tuple per push (one more
    object for the cyclic collector to walk). Here there is one table; while requests arrive in key
    order (the usual case) the run holds the requests themselves, with the tail's key in three
    slots, and entries are built only when the queue turns into a heap; and `push_behind` says
    whether the head can have changed, so a push behind the head asks for no head. Only DRR builds
    it, and only DRR mutates `costs`: `remove` is called for queued requests only, and DRR deletes
    the cost right after; `pop` leaves the cost for DRR to take.
    """

    __slots__ = ("_heap", "_removed", "_run", "_tail_deadline", "_tail_rank", "_tail_seq", "costs")

    head_static = True
    """The head moves only by push, pop and remove (see `ordering._LazyRemoval`)."""

    def __init__(self) -> None:
        self.costs: dict[int, int] = {}
        self._run: deque[Request] = deque()
        """Requests in key order, as long as they arrive in key order (`KeyedQueue`'s run)."""
        self._tail_rank, self._tail_deadline, self._tail_seq = 0, _NO_DEADLINE, -1
        """The key of the run's last request (meaningless while the run is empty)."""
        self._heap: list[tuple[Any, ...]] = []
        """`(rank, deadline, seq, request)` entries, used instead of `_run` while not empty."""
        self._removed: set[int] | None = None

    def push(self, request: Request) -> None:
        self.push_behind(request)

    def push_behind(self, request: Request) -> bool:
        """Queue `request` (its cost already in `costs`); True when it went behind the tail of a
        queue that holds a live head, which it then cannot have displaced."""
        deadline = request.deadline_s
        if deadline is None:
            deadline = _NO_DEADLINE
        rank, seq = TIER_RANK[request.tier], request.seq
        heap = self._heap
        if heap:
            heapq.heappush(heap, (rank, deadline, seq, request))
            return False
        run = self._run
        if run:
            tail_rank = self._tail_rank
            if rank < tail_rank or (
                rank == tail_rank
                and (
                    deadline < self._tail_deadline
                    or (deadline == self._tail_deadline and seq < self._tail_seq)
                )
            ):  # the entry tuple comparison `entry < tail`, spelled out: it goes before the tail
                heap.extend([(TIER_RANK[r.tier], _deadline(r), r.seq, r) for r in run])
                run.clear()  # a sorted list is a heap already
                heapq.heappush(heap, (rank, deadline, seq, request))
                return False
        run.append(request)
        self._tail_rank, self._tail_deadline, self._tail_seq = rank, deadline, seq
        return len(self.costs) > 1  # another live request: the head is at or before the tail

    def _clean(self) -> None:
        removed = self._removed
        assert removed is not None
        heap, run = self._heap, self._run
        while heap and heap[0][2] in removed:
            removed.discard(heapq.heappop(heap)[2])
        while not heap and run and run[0].seq in removed:
            removed.discard(run.popleft().seq)
        if not removed:
            self._removed = None

    def head(self, now: float) -> Request | None:
        if self._removed:
            self._clean()
        heap = self._heap
        if heap:
            request: Request = heap[0][3]
            return request
        run = self._run
        return run[0] if run else None

    def pop(self, now: float) -> Request:
        if self._removed:
            self._clean()
        heap = self._heap
        if heap:
            request: Request = heapq.heappop(heap)[3]
            return request
        return self._run.popleft()

    def remove(self, request: Request) -> bool:
        if request.seq not in self.costs:
            return False
        if self._removed is None:
            self._removed = set()
        self._removed.add(request.seq)
        return True

    def __len__(self) -> int:
        return len(self.costs)
