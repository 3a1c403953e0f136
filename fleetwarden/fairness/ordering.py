"""Orderings of requests inside one queue: FIFO, tier priority, EDF and SageServe's DPA.

A policy keeps one queue per tenant (or one global queue under FCFS) and asks it for its head.
Every operation is O(log n) amortised. Cancelled requests are removed lazily: marked, and skipped
when they reach the head, so `remove` is O(1).

DPA's categories depend on the time (a request moves from non-urgent to urgent to recently expired
to severely expired as `now` advances). Time only moves forward, so each request migrates between
per-tier heaps at most twice, in deadline order, and the head is found by looking at a few heap
tops: still O(log n) amortised.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from fleetwarden.api.enums import Ordering, Tier
from fleetwarden.fairness.request import TIER_RANK, Request


class RequestQueue(Protocol):
    def push(self, request: Request) -> None: ...

    def head(self, now: float) -> Request | None: ...

    def pop(self, now: float) -> Request:
        """Remove and return the head; only call when `head(now)` is not None."""
        ...

    def remove(self, request: Request) -> bool: ...

    def __len__(self) -> int: ...


class _LazyRemoval:
    """Membership and O(1) cancellation shared by the queues: a removed request is only marked,
    and dropped when it reaches the head."""

    __slots__ = ("_members", "_removed")

    head_static = True
    """`head(now)` ignores `now`: the head changes only by push, pop and remove, so a policy that
    re-files a tenant after each of those may trust the head it filed instead of asking again."""

    def __init__(self) -> None:
        self._removed: set[int] | None = None
        """Seqs removed but not yet dropped; None while there are none, so that the check on every
        head and pop reads a slot of this object instead of a set elsewhere in memory."""
        self._members: set[int] = set()

    def remove(self, request: Request) -> bool:
        if request.seq not in self._members:
            return False
        self._members.discard(request.seq)
        if self._removed is None:
            self._removed = set()
        self._removed.add(request.seq)
        return True

    def __len__(self) -> int:
        return len(self._members)


class FifoQueue(_LazyRemoval):
    """Arrival order."""

    __slots__ = ("_items",)

    head_stable_on_push = True
    """Appending never changes a non-empty queue's head (policies skip re-filing on push)."""

    def __init__(self) -> None:
        super().__init__()
        self._items: deque[Request] = deque()

    def push(self, request: Request) -> None:
        self._items.append(request)
        self._members.add(request.seq)

    def _clean(self) -> None:
        items, removed = self._items, self._removed
        assert removed is not None
        while items and items[0].seq in removed:
            removed.discard(items.popleft().seq)
        if not removed:
            self._removed = None

    def head(self, now: float) -> Request | None:
        if self._removed:
            self._clean()
        items = self._items
        return items[0] if items else None

    def pop(self, now: float) -> Request:
        if self._removed:
            self._clean()
        request = self._items.popleft()
        self._members.discard(request.seq)
        return request


class KeyedQueue(_LazyRemoval):
    """Ordered by `key(request)`, then arrival: tier priority and EDF.

    Entries are flat `(*key, seq, request)` tuples rather than `(key, seq, request)`: comparing
    them then walks one tuple instead of recursing into a nested key tuple. Equal keys fall through
    to `seq`, which is unique, so requests are never compared; `key` must return tuples of one
    length.

    Fast path: while requests arrive in key order (one tier and no deadline, or deadlines in
    arrival order: the usual case), the entries are kept in `_run`, a deque that is sorted by
    construction, so a push appends and a pop takes the front, with no sift. A push that would go
    before the tail moves the run into `_heap` (a sorted list already is a heap) and the queue is a
    heap until that empties. Either way the head is the least entry, so the order is the same.
    """

    __slots__ = ("_heap", "_key", "_run")

    def __init__(self, key: Callable[[Request], tuple[float, ...]]) -> None:
        super().__init__()
        self._key = key
        self._run: deque[tuple[Any, ...]] = deque()
        self._heap: list[tuple[Any, ...]] = []
        """Used instead of `_run` while it is not empty (then `_run` is)."""

    def _entry(self, request: Request) -> tuple[Any, ...]:
        return self._key(request) + (request.seq, request)  # noqa: RUF005 (cheaper than *)

    def push(self, request: Request) -> None:
        entry = self._entry(request)
        heap = self._heap
        if heap:
            heapq.heappush(heap, entry)
        else:
            run = self._run
            if run and entry < run[-1]:
                heap.extend(run)
                run.clear()
                heapq.heappush(heap, entry)
            else:
                run.append(entry)
        self._members.add(request.seq)

    def _pop_entry(self) -> tuple[Any, ...]:
        heap = self._heap
        return heapq.heappop(heap) if heap else self._run.popleft()

    def _clean(self) -> None:
        removed = self._removed
        assert removed is not None
        while (front := self._heap or self._run) and front[0][-2] in removed:
            removed.discard(self._pop_entry()[-2])
        if not removed:
            self._removed = None

    def head(self, now: float) -> Request | None:
        if self._removed:
            self._clean()
        front = self._heap or self._run
        return front[0][-1] if front else None

    def pop(self, now: float) -> Request:
        if self._removed:
            self._clean()
        heap = self._heap
        request: Request = (heapq.heappop(heap) if heap else self._run.popleft())[-1]
        self._members.discard(request.seq)
        return request


def _deadline(request: Request) -> float:
    return math.inf if request.deadline_s is None else request.deadline_s


def priority_key(request: Request) -> tuple[float, ...]:
    return (TIER_RANK[request.tier],)


def edf_key(request: Request) -> tuple[float, ...]:
    """Earliest deadline first; expired requests have the earliest deadlines, so they go first."""
    return (_deadline(request),)


class DeadlinePriorityQueue:
    """SageServe 6.5's DPA: severely expired, urgent IW-F, urgent IW-N, non-urgent IW-F,
    non-urgent IW-N, then recently expired (NIW after IW-N in each band).

    d = deadline - now. Severely expired: d < -tau_n; recently expired: -tau_n <= d < 0;
    urgent: 0 <= d <= tau_p; non-urgent: d > tau_p. Requests without a deadline are never urgent
    or expired. Within a band, earliest deadline first, then arrival.
    """

    def __init__(self, severely_expired_s: float, urgent_within_s: float) -> None:
        self._tau_n = severely_expired_s
        self._tau_p = urgent_within_s
        tiers = sorted(TIER_RANK, key=TIER_RANK.__getitem__)
        self._tiers: list[Tier] = tiers
        self._live = {t: KeyedQueue(edf_key) for t in tiers}
        self._recent = {t: KeyedQueue(edf_key) for t in tiers}
        self._severe = KeyedQueue(edf_key)
        self._where: dict[int, KeyedQueue] = {}

    def push(self, request: Request) -> None:
        queue = self._live[request.tier]
        queue.push(request)
        self._where[request.seq] = queue

    def _move(self, request: Request, source: KeyedQueue, target: KeyedQueue, now: float) -> None:
        source.pop(now)
        target.push(request)
        self._where[request.seq] = target

    def _advance(self, now: float) -> None:
        for tier in self._tiers:
            live, recent = self._live[tier], self._recent[tier]
            while (head := live.head(now)) is not None and _deadline(head) < now:
                self._move(head, live, recent, now)
            while (head := recent.head(now)) is not None and _deadline(head) < now - self._tau_n:
                self._move(head, recent, self._severe, now)

    def _select(self, now: float) -> tuple[Request, KeyedQueue] | None:
        self._advance(now)
        severe = self._severe.head(now)
        if severe is not None:
            return severe, self._severe
        for urgent_only in (True, False):
            for tier in self._tiers:
                head = self._live[tier].head(now)
                if head is None:
                    continue
                if not urgent_only or _deadline(head) - now <= self._tau_p:
                    return head, self._live[tier]
        recent = [(q.head(now), q) for q in self._recent.values()]
        candidates = [(r, q) for r, q in recent if r is not None]
        if not candidates:
            return None
        return min(candidates, key=lambda rq: (_deadline(rq[0]), rq[0].seq))

    def head(self, now: float) -> Request | None:
        selected = self._select(now)
        return selected[0] if selected is not None else None

    def pop(self, now: float) -> Request:
        selected = self._select(now)
        assert selected is not None, "pop() on an empty queue"
        request, queue = selected
        queue.pop(now)
        del self._where[request.seq]
        return request

    def remove(self, request: Request) -> bool:
        queue = self._where.pop(request.seq, None)
        return queue is not None and queue.remove(request)

    def __len__(self) -> int:
        return len(self._where)


def queue_factory(
    ordering: Ordering, *, severely_expired_s: float = 2.0, urgent_within_s: float = 0.5
) -> Callable[[], RequestQueue]:
    """A constructor of empty queues with the given ordering."""
    if ordering is Ordering.FIFO:
        return FifoQueue
    if ordering is Ordering.PRIORITY:
        return lambda: KeyedQueue(priority_key)
    if ordering is Ordering.EDF:
        return lambda: KeyedQueue(edf_key)
    return lambda: DeadlinePriorityQueue(severely_expired_s, urgent_within_s)
