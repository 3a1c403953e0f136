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

Selection is a heap of (counter, head arrival, tenant) entries kept lazily. Counters only grow
between dispatches (charges and lifts add; only a prediction refund subtracts, and that re-files
the tenant at once), so an entry's key is a lower bound of its tenant's live counter: charging a
token is O(1) and touches no heap, and when an entry with an outdated key reaches the top it is
re-keyed in place. The first top entry whose key and head match its tenant's live state is the
true minimum. Every operation is O(log n) amortised; the heap is compacted when stale entries
outnumber live ones.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fleetwarden.fairness.ordering import FifoQueue, RequestQueue
from fleetwarden.fairness.request import Request


@dataclass(frozen=True)
class TokenPrices:
    """What one token costs in the counters (VTC's w_p and w_q)."""

    input: float = 1.0
    output: float = 2.0


class VirtualTokenCounter:
    """VTC, optionally weighted and with length prediction. See the module docstring."""

    lift = True

    def __init__(
        self,
        prices: TokenPrices | None = None,
        *,
        weights: Mapping[str, float] | Callable[[str], float] | None = None,
        predict: Callable[[Request], int | None] | None = None,
        queue_factory: Callable[[], RequestQueue] = FifoQueue,
    ) -> None:
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
        self._heads_stable = bool(getattr(queue_factory(), "head_stable_on_push", False))
        """FIFO appends never change a non-empty queue's head: pushes then touch no heap."""
        self._weighted = weights is not None
        self.counters: dict[str, float] = {}
        self._queues: dict[str, RequestQueue] = {}
        self._queued = 0
        self._heap: list[tuple[float, int, str]] = []
        self._filed: dict[str, tuple[float, int]] = {}
        """Each tenant's latest heap entry (key, head seq); any other entry of it is stale."""
        self._last_left: str | None = None
        self._predicted: dict[int, int] = {}
        """Predicted output tokens charged at dispatch, per running request (by seq)."""
        self._now = float("-inf")
        """The latest time seen; `remove` has no `now` of its own."""

    # -- queue membership -------------------------------------------------------------------

    def __len__(self) -> int:
        return self._queued

    def queued_tenants(self) -> list[str]:
        """Tenants with at least one queued request (VTC's P), sorted for determinism."""
        return sorted(t for t, q in self._queues.items() if len(q))

    def _file(self, tenant: str, now: float) -> None:
        """Add a heap entry for the tenant's current counter and head (if it has queued work)."""
        self._now = max(self._now, now)
        head = self._queues[tenant].head(self._now)
        if head is not None:
            self._filed[tenant] = (self.counters[tenant], head.seq)
            heapq.heappush(self._heap, (self.counters[tenant], head.seq, tenant))
            if len(self._heap) > 4 * len(self._queues) + 1024:
                self._compact()

    def _compact(self) -> None:
        self._heap = []
        self._filed = {}
        for tenant, queue in self._queues.items():
            head = queue.head(self._now)
            if head is not None:
                self._filed[tenant] = (self.counters[tenant], head.seq)
                self._heap.append((self.counters[tenant], head.seq, tenant))
        heapq.heapify(self._heap)

    def _min_tenant(self) -> str | None:
        heap, queues, filed, now = self._heap, self._queues, self._filed, self._now
        while heap:
            key, head_seq, tenant = heap[0]
            head = queues[tenant].head(now)
            if head is None or filed.get(tenant) != (key, head_seq):
                heapq.heappop(heap)  # the tenant left the queue, or a newer entry supersedes this
                continue
            counter = self.counters[tenant]
            if key == counter and head_seq == head.seq:
                return tenant
            # The tenant was charged (or its time-dependent head moved) since filing: re-key.
            filed[tenant] = (counter, head.seq)
            heapq.heapreplace(heap, (counter, head.seq, tenant))
        return None

    def min_queued_counter(self) -> float | None:
        """The least counter among tenants with queued requests."""
        tenant = self._min_tenant()
        return None if tenant is None else self.counters[tenant]

    # -- the protocol -----------------------------------------------------------------------

    def push(self, request: Request, now: float) -> None:
        tenant = request.tenant
        self.counters.setdefault(tenant, 0.0)
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = self._queue_factory()
        if self.lift and len(queue) == 0:
            if self._queued == 0:
                if self._last_left is not None:
                    floor = self.counters[self._last_left]
                    self.counters[tenant] = max(self.counters[tenant], floor)
            else:
                floor_or_none = self.min_queued_counter()
                if floor_or_none is not None:
                    self.counters[tenant] = max(self.counters[tenant], floor_or_none)
        self._now = max(self._now, now)
        if not len(queue):
            queue.push(request)
            self._file(tenant, now)
        elif self._heads_stable:
            queue.push(request)
        else:
            was_head = queue.head(self._now)
            queue.push(request)
            if queue.head(self._now) is not was_head:
                self._file(tenant, now)
        self._queued += 1

    def peek(self, now: float) -> Request | None:
        self._now = max(self._now, now)
        tenant = self._min_tenant()
        return None if tenant is None else self._queues[tenant].head(now)

    def pop(self, now: float) -> Request | None:
        self._now = max(self._now, now)
        tenant = self._min_tenant()
        if tenant is None:
            return None
        request = self._queues[tenant].pop(now)
        self._queued -= 1
        self._last_left = tenant
        cost = self.prices.input * request.input_tokens
        if self._predict is not None:
            predicted = max(0, self._predict(request) or 0)
            self._predicted[request.seq] = predicted
            cost += self.prices.output * predicted
        self.counters[tenant] += cost / self._weight(tenant) if self._weighted else cost
        self._file(tenant, now)
        return request

    def charge(
        self, request: Request, *, input_tokens: int = 0, output_tokens: int = 0, now: float
    ) -> None:
        """Charge service as it is delivered. `request.output_tokens` must not yet include these."""
        billable_output = output_tokens
        predicted = self._predicted.get(request.seq)
        if predicted is not None:
            before, after = request.output_tokens, request.output_tokens + output_tokens
            billable_output = max(0, after - predicted) - max(0, before - predicted)
        cost = self.prices.input * input_tokens + self.prices.output * billable_output
        if cost:
            tenant = request.tenant
            if self._weighted:
                cost /= self._weight(tenant)
            self.counters[tenant] = self.counters.get(tenant, 0.0) + cost
            if cost < 0 and tenant in self._queues:  # keys must stay lower bounds: re-file
                self._file(tenant, now)

    def complete(self, request: Request, now: float) -> None:
        """Refund the part of a prediction that was not generated (Algorithm 3)."""
        predicted = self._predicted.pop(request.seq, None)
        if predicted is None or request.output_tokens >= predicted:
            return
        tenant = request.tenant
        refund = self.prices.output * (predicted - request.output_tokens)
        self.counters[tenant] -= refund / self._weight(tenant)
        if tenant in self._queues:
            self._file(tenant, now)

    def remove(self, request: Request) -> bool:
        queue = self._queues.get(request.tenant)
        if queue is None or not queue.remove(request):
            return False
        self._queued -= 1
        self._file(request.tenant, self._now)
        return True


class LeastCounterFirst(VirtualTokenCounter):
    """VTC without the counter lift: the paper's negative control (not fair on ON/OFF load)."""

    lift = False
