"""Virtual Token Counter (Sheng et al., OSDI'24, Algorithm 2) and its variants.

- `VirtualTokenCounter`: one counter per tenant; a tenant (re)joining the queue is lifted to the
  least counter among tenants with queued requests, or, when the queue was empty, to the counter
  of the last tenant to leave it (lines 7-13); the tenant with the least counter dispatches its
  earliest request (lines 20-21), charged w_p per input token at dispatch (line 24) and w_q per
  generated token (line 30).
- weighted: every charge is divided by the tenant's weight (section 4.2), so a weight-2 tenant gets
  twice the service of a weight-1 tenant while both are backlogged.
- with length prediction (Algorithm 3): the predicted output is charged at dispatch; generated
  tokens beyond the prediction are charged as they come; unused prediction is refunded on completion.
- `LeastCounterFirst`: VTC without the lift. Not fair (a tenant returning from idle starves the
  others until it catches up); kept as the paper's negative control.

Selection is a heap of (counter, head seq, tenant) entries kept lazily. Counters only grow
between dispatches (charges and lifts add; a negative correction or a prediction refund subtracts,
and those re-file the tenant at once), so an entry's key is a lower bound of its tenant's live
counter: charging a token is O(1) and touches no heap, and when an entry with an outdated key
reaches the top it is re-keyed in place. The first top entry whose key and head match its tenant's
live state is the true minimum. Every operation is O(log n) amortised.

Fast paths (one decision per dispatched request and one charge per generated token, so these run
millions of times; `bench/scheduler_decisions.py` measures them, `tests/fairness/test_fast_paths.py`
checks them against a scan):

- Each tenant's state is one `_Tenant` record (its queue and its live heap entry), and entries
  point at the record, so a dispatch reaches the queue without a dictionary lookup; at 10,000
  tenants the decision's cost is mostly memory traffic, so every object not touched counts.
- Each queued tenant has exactly one live entry, its record's `entry`; an entry is live iff it *is*
  (identity, not equality) that one, so checking builds and compares no tuple, and
  `entry is not None` doubles as "the tenant has queued requests", with no call to the queue.
- With an ordering whose head moves only by push, pop and remove (`head_static`: FIFO, priority,
  EDF), every head change re-files the tenant, so the filed head seq is the live one: selection
  compares counters only and never asks the queue.
- `pop` re-files the dispatched tenant by replacing the heap top (its own live entry) in one sift
  instead of pushing a new entry and leaving a stale one to be popped later.
- Pushing behind a queued tenant's head with a FIFO queue touches neither heap nor counters.
- Stale entries (left by re-files away from the top) are compacted when they outnumber live ones,
  which never changes a live key and so never changes a decision.

With an ordering whose head changes by the passage of time alone (DPA), a tenant's head is re-read
when the tenant is touched (push, pop, remove, a refund or negative correction) or its entry
reaches the top of the heap; until then its entry keeps the head seq it was filed with. Counters
are exact either way, so the dispatching tenant always has the least counter; only among tenants
tied at that counter are heads compared as filed, which is not always as they are now
(`_min_entry` says why they are not re-read). WSC and DRR document the same lapse.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from heapq import heapify, heappop, heappush, heapreplace

from fleetwarden.fairness.left_floor import LeftFloor
from fleetwarden.fairness.ordering import FifoQueue, RequestQueue
from fleetwarden.fairness.request import Request


class _Tenant:
    """A tenant's queue and its live heap entry (None while nothing is queued): one object, so a
    dispatch reaches both from the heap entry without looking the tenant up in dictionaries."""

    __slots__ = ("entry", "name", "queue")

    def __init__(self, name: str, queue: RequestQueue) -> None:
        self.name = name
        self.queue = queue
        self.entry: Entry | None = None

    def __lt__(self, other: _Tenant) -> bool:
        """Entries never tie up to here (head seqs are unique); if they ever did, by name."""
        return self.name < other.name


Entry = tuple[float, int, _Tenant]
"""A heap entry: (counter when filed, seq of the head when filed, tenant). It is live while it is
its tenant's `entry` (compared by identity); any other entry is stale."""


@dataclass(frozen=True, slots=True)
class TokenPrices:
    """What one token costs in the counters (VTC's w_p and w_q)."""

    input: float = 1.0
    output: float = 2.0


class VirtualTokenCounter(LeftFloor):
    """VTC, optionally weighted and with length prediction. See the module docstring; the floor
    of a tenant joining an empty queue, and its survival of `forget`, are `LeftFloor`'s."""

    lift = True

    def __init__(
        self,
        prices: TokenPrices | None = None,
        *,
        weights: Mapping[str, float] | Callable[[str], float] | None = None,
        predict: Callable[[Request], int | None] | None = None,
        queue_factory: Callable[[], RequestQueue] = FifoQueue,
    ) -> None:
        super().__init__()
        self.prices = prices or TokenPrices()
        if weights is None:
            self._weight: Callable[[str], float] = lambda _tenant: 1.0
        elif callable(weights):
            self._weight = weights
        else:
            table = dict(weights)
            self._weight = lambda tenant: table.get(tenant, 1.0)
        self._predict = predict
        self._queue_factory = queue_factory
        probe = queue_factory()
        self._heads_stable = bool(getattr(probe, "head_stable_on_push", False))
        """FIFO appends never change a non-empty queue's head: pushes then touch no heap."""
        self._heads_static = bool(getattr(probe, "head_static", False))
        """Heads move only by push, pop and remove, each of which re-files the tenant, so a live
        entry's head seq is the head's: selection need not ask the queue (FIFO, priority, EDF)."""
        self._weighted = weights is not None
        self.counters: dict[str, float] = {}
        self._tenants: dict[str, _Tenant] = {}
        self._queued = 0
        self._heap: list[Entry] = []
        self._live = 0
        """Tenants with a live entry, i.e. with queued requests."""
        self._predicted: dict[int, int] = {}
        """Predicted output tokens charged at dispatch, per running request (by seq)."""
        self._now = float("-inf")
        """The latest time seen; `remove` has no `now` of its own."""

    # -- queue membership -------------------------------------------------------------------

    def __len__(self) -> int:
        return self._queued

    def queued_tenants(self) -> list[str]:
        """Tenants with at least one queued request (VTC's P), sorted for determinism."""
        return sorted(name for name, state in self._tenants.items() if state.entry is not None)

    def _file(self, state: _Tenant, counter: float, head_seq: int) -> None:
        """Make (counter, head_seq) the tenant's live entry; its previous one turns stale."""
        if state.entry is None:
            self._live += 1
        entry = state.entry = (counter, head_seq, state)
        heap = self._heap
        heappush(heap, entry)
        if len(heap) > 2 * self._live + 1024:  # stale entries dominate: keep only live ones
            heap = self._heap = [e for e in heap if e[2].entry is e]
            heapify(heap)

    def _unfile(self, state: _Tenant) -> None:
        if state.entry is not None:
            state.entry = None
            self._live -= 1

    def _refile(self, tenant: str, now: float) -> None:
        """File the tenant's live counter and head (or drop it when it has nothing queued)."""
        if now > self._now:
            self._now = now
        state = self._tenants.get(tenant)
        if state is None:
            return
        head = state.queue.head(self._now)
        if head is None:
            self._unfile(state)
        else:
            self._file(state, self.counters[tenant], head.seq)

    def _min_entry(self) -> Entry | None:
        """The live entry of the tenant to dispatch from, re-keying outdated entries on the way;
        it is left at the top of the heap.

        Under a time-dependent ordering (DPA) only the top entry's head is re-read, so a tie at
        the least counter goes to the least head seq as filed, not as of now (module docstring).
        Re-reading every tied tenant's head would make ties exact, but the tie group is not
        small: the lift puts every tenant that joins the queue exactly at the least counter, so
        after a burst of arrivals it can hold every queued tenant, and each decision would be
        O(n) until they are served. Knowing which heads moved would need the queue to say when
        its head next changes with time, which `RequestQueue` does not. The lapse touches no
        counter: the fairness bound is unchanged, only the order among equals."""
        heap, counters = self._heap, self.counters
        while heap:
            entry = heap[0]
            state = entry[2]
            if state.entry is not entry:
                heappop(heap)  # superseded by a newer entry, or the tenant left the queue
                continue
            counter = counters[state.name]
            if self._heads_static:
                if entry[0] == counter:
                    return entry
                head_seq = entry[1]
            else:
                head = state.queue.head(self._now)
                if head is None:  # not reachable while entries track membership; stay safe
                    self._unfile(state)
                    heappop(heap)
                    continue
                head_seq = head.seq
                if entry[0] == counter and entry[1] == head_seq:
                    return entry
            # The tenant was charged (or its time-dependent head moved) since filing: re-key.
            entry = state.entry = (counter, head_seq, state)
            heapreplace(heap, entry)
        return None

    def min_queued_counter(self) -> float | None:
        """The least counter among tenants with queued requests."""
        entry = self._min_entry()
        return None if entry is None else entry[0]

    # -- the protocol -----------------------------------------------------------------------

    def push(self, request: Request, now: float) -> None:
        tenant = request.tenant
        state = self._tenants.get(tenant)
        if state is not None and state.entry is not None:
            # Queued already: no lift, and a FIFO head does not move.
            if now > self._now:
                self._now = now
            queue = state.queue
            if self._heads_stable:
                queue.push(request)
            else:
                # Re-file when the head is not the one filed: moved by this push, or (DPA) by
                # time since the tenant was last touched. With `head_static` queues the filed
                # head is the head before the push, so only the push can have moved it.
                queue.push(request)
                head = queue.head(self._now)
                if head is not None and head.seq != state.entry[1]:
                    self._file(state, self.counters[tenant], head.seq)
            self._queued += 1
            return
        counters = self.counters
        counter = counters.setdefault(tenant, 0.0)
        if state is None:
            state = self._tenants[tenant] = _Tenant(tenant, self._queue_factory())
        if self.lift:  # (re)joining; the floor is found as of the previous push's time
            if self._queued == 0:
                left = self._left_counter()
                if left is not None:
                    counter = max(counter, left)
            else:
                floor = self.min_queued_counter()
                if floor is not None:
                    counter = max(counter, floor)
            counters[tenant] = counter
        if now > self._now:
            self._now = now
        state.queue.push(request)
        self._file(state, counter, request.seq)  # the only request is the head
        self._queued += 1

    def peek(self, now: float) -> Request | None:
        if now > self._now:
            self._now = now
        entry = self._min_entry()
        return None if entry is None else entry[2].queue.head(now)

    def pop(self, now: float) -> Request | None:
        if now > self._now:
            self._now = now
        entry = self._min_entry()
        if entry is None:
            return None
        state = entry[2]
        tenant, queue = state.name, state.queue
        request = queue.pop(now)
        self._queued -= 1
        self._last_left = tenant
        cost = self._dispatch_cost(request)
        counters = self.counters
        counter = counters[tenant] + cost
        counters[tenant] = counter
        head = queue.head(self._now)
        heap = self._heap
        if heap[0] is not entry:  # only if a callback above re-entered the policy
            self._refile(tenant, now)
        elif head is None:
            heappop(heap)
            self._unfile(state)
        else:
            # Re-file in place: the top is the tenant's own entry, now outdated.
            entry = state.entry = (counter, head.seq, state)
            heapreplace(heap, entry)
        return request

    def _dispatch_cost(self, request: Request) -> float:
        """What dispatching `request` adds to its tenant's counter: its input tokens, plus its
        predicted output with length prediction (recorded for the refund), over its weight."""
        prices = self.prices
        cost = prices.input * request.input_tokens
        if self._predict is not None:
            predicted = max(0, self._predict(request) or 0)
            self._predicted[request.seq] = predicted
            cost += prices.output * predicted
        return cost / self._weight(request.tenant) if self._weighted else cost

    def push_pop(self, request: Request, now: float) -> None:
        """`push(request, now)` then `pop(now)` on an empty policy, which dispatches exactly that
        request: the same counters and the same later decisions, without filing the tenant in
        the heap and taking it out again. For a shell that finds its queue empty and the engine
        free when a request arrives (the usual case below saturation). `now` is the dispatch
        time; the push's own time, no later, would change nothing here (nobody else is queued,
        so the lift reads only the last tenant to leave).
        `tests/fairness/test_push_pop.py` checks it against `push` and `pop`."""
        if self._queued:
            raise ValueError("push_pop needs an empty policy: push, then pop")
        tenant = request.tenant
        counters = self.counters
        counter = counters.get(tenant, 0.0)
        if tenant not in self._tenants:  # as `push` would create it (`remove` and `complete` ask)
            self._tenants[tenant] = _Tenant(tenant, self._queue_factory())
        left = self._left_counter() if self.lift else None
        if left is not None:  # joining an empty queue (lines 7-13)
            counter = max(counter, left)
        if now > self._now:
            self._now = now
        self._last_left = tenant
        cost = self._dispatch_cost(request)
        counters[tenant] = counter + cost

    def charge(
        self, request: Request, *, input_tokens: int = 0, output_tokens: int = 0, now: float
    ) -> None:
        """Charge service as it is delivered. `request.output_tokens` must not yet include these."""
        billable_output = output_tokens
        if self._predicted:
            predicted = self._predicted.get(request.seq)
            if predicted is not None:
                # max(0, after - predicted) - max(0, before - predicted), without the calls
                before = request.output_tokens
                over_before, over_after = before - predicted, before + output_tokens - predicted
                billable_output = (over_after if over_after > 0 else 0) - (
                    over_before if over_before > 0 else 0
                )
        prices = self.prices
        cost = prices.input * input_tokens + prices.output * billable_output
        if cost:
            tenant = request.tenant
            if self._weighted:
                cost /= self._weight(tenant)
            counters = self.counters
            counters[tenant] = counters.get(tenant, 0.0) + cost
            if cost < 0 and tenant in self._tenants:  # keys must stay lower bounds: re-file
                self._refile(tenant, now)

    def complete(self, request: Request, now: float) -> None:
        """Refund the part of a prediction that was not generated (Algorithm 3)."""
        predicted = self._predicted.pop(request.seq, None)
        if predicted is None or request.output_tokens >= predicted:
            return
        tenant = request.tenant
        refund = self.prices.output * (predicted - request.output_tokens)
        self.counters[tenant] -= refund / self._weight(tenant)
        if tenant in self._tenants:
            self._refile(tenant, now)

    def forget(self, tenant: str) -> None:
        """Drop an idle tenant's counter and queue record (`fairness.idle`): its next request
        joins as a new tenant's would, lifted to the floor. The tenant must have nothing queued
        and nothing running (a running request's charges would land on a fresh counter)."""
        state = self._tenants.get(tenant)
        if state is not None and state.entry is not None:
            raise ValueError(f"tenant {tenant!r} has queued requests and cannot be forgotten")
        self._forget_counter(tenant)  # the floor outlives it if it was the last to leave
        self._tenants.pop(tenant, None)

    def remove(self, request: Request) -> bool:
        state = self._tenants.get(request.tenant)
        if state is None or not state.queue.remove(request):
            return False
        self._queued -= 1
        self._refile(request.tenant, self._now)
        return True


class LeastCounterFirst(VirtualTokenCounter):
    """VTC without the counter lift: the paper's negative control (not fair on ON/OFF load)."""

    lift = False
