"""The per-kind lanes of FairServe's WSC (`wsc.py`): each user's queue of one kind of request
(continuations, or new interactions) and the lazy heap that finds the least-served user with one
queued. Kept apart from the policy so each module stays one thing: this one is the data structure,
`wsc.py` the accounting and the selection rules.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush, heapreplace

from fleetwarden.fairness.ordering import RequestQueue


class Lane:
    """One user's queue of one kind, and its live heap entry (None while that queue is empty)."""

    __slots__ = ("entry", "name", "queue")

    def __init__(self, name: str, queue: RequestQueue) -> None:
        self.name = name
        self.queue = queue
        self.entry: Entry | None = None

    def __lt__(self, other: Lane) -> bool:
        """Entries never tie up to here (head seqs are unique); if they ever did, by name."""
        return self.name < other.name


Entry = tuple[float, int, Lane]
"""A heap entry: (counter when filed, head seq as of the user's last refresh, lane). It is live
while it is its lane's `entry` (compared by identity); any other entry is stale."""


class Kind:
    """One kind of request (continuations, or new interactions): every user's lane of that kind
    and the heap that finds the least-served user among those with one queued.

    An entry whose lane no longer holds it is stale and is dropped when it reaches the top; the
    heap is rebuilt from the live entries when stale ones dominate, which changes no key.
    """

    __slots__ = ("heap", "lanes", "live")

    def __init__(self) -> None:
        self.lanes: dict[str, Lane] = {}
        self.heap: list[Entry] = []
        self.live = 0
        """Lanes with a live entry, i.e. with queued requests."""

    def queued(self, tenant: str) -> bool:
        lane = self.lanes.get(tenant)
        return lane is not None and lane.entry is not None

    def file(self, lane: Lane, counter: float, head_seq: int) -> None:
        if lane.entry is None:
            self.live += 1
        entry = lane.entry = (counter, head_seq, lane)
        heap = self.heap
        heappush(heap, entry)
        if len(heap) > 2 * self.live + 64:
            heap = self.heap = [e for e in heap if e[2].entry is e]
            heapify(heap)

    def unfile(self, lane: Lane) -> None:
        if lane.entry is not None:
            lane.entry = None
            self.live -= 1

    def top(self, counters: dict[str, float]) -> Entry | None:
        """The least (counter, head seq) entry, re-keying outdated counters on the way; it is
        left at the top of the heap."""
        heap = self.heap
        while heap:
            entry = heap[0]
            lane = entry[2]
            if lane.entry is not entry:
                heappop(heap)
                continue
            counter = counters[lane.name]
            if entry[0] == counter:
                return entry
            entry = lane.entry = (counter, entry[1], lane)  # charged since filing: re-key
            heapreplace(heap, entry)
        return None


__all__ = ["Entry", "Kind", "Lane"]
