"""Deficit round robin across tenants inside strict tier bands (Cohere's Serving Fairness).

Three selectors, in this order: the tier band (a band with queued work always goes before every
lower band, so tiers are commercial commitments, not weights), then DRR across the tenants of the
band, then the tenant's own ordering of its requests (`queue_factory`; by default priority, then
deadline, then arrival, as the blog's third selector does).

DRR (Shreedhar and Varghese): every active tenant (one with queued requests) is visited in turn;
a visit adds the band's quantum to the tenant's deficit, and the tenant dispatches its head while
the head's cost fits in the deficit, paying the cost out of it. A head that does not fit ends the
turn; the tenant keeps its deficit and waits for its next visit. A tenant whose queue empties
leaves and its deficit resets to 0, so no tenant banks credit while idle.

Cost is 1 per request in `requests` mode and `input_tokens + output budget` in `tokens` mode, the
output budget being `predicted_output_tokens` when the shell set one and `max_output_tokens`
otherwise (what the capacity gate reserves). The cost is fixed when the request is queued.
`charge` and `complete` are no-ops: DRR pays the estimate at dispatch, like the gate reserves it;
refunding unused output later would credit a tenant whose queue may have emptied meanwhile (and
whose deficit must stay 0), and would let a tenant exceed one quantum per round.

Which tier a tenant is in: the `tiers` table wins for every tenant it names (`from_config` names
all of them, unlisted ones taking `defaults.tier`), so a tenant cannot jump a band by labelling its
requests `iw-f`; the request's own tier then only orders the tenant's queue. A tenant the table
does not name (or with no table) is placed by each request's tier, and has one independent flow,
with its own deficit, in each band it has requests in.

Where the papers are silent:

- Rounds and newcomers. Visits happen in rounds; in each round every active tenant of the band gets
  exactly one visit, always in the same cyclic order. A tenant that becomes active joins at the
  start of the next round. It waits at most the rest of the current round, as under classic DRR's
  "append to the tail", and it cannot be visited twice in one round by leaving and rejoining.
- Peek and pop. `peek(now)` returns exactly what `pop(now)` dispatches. A turn ends, and the ring
  moves on, only inside `pop`, so a declined `peek` never costs a tenant its turn.

Complexity. Visits are never simulated one by one. A tenant at its next visit in round r, with
deficit d and head cost c, next fits in round r + max(1, ceil((c - d) / q)) - 1; the band keeps a
heap of (fit round, place in the cycle), and the next tenant to dispatch is its minimum. Other
tenants' deficits are credited lazily, from the number of rounds that went by, only when they are
touched. So push, peek, pop and remove are O(log n) amortised in tenants and queued requests
(stale heap entries are skipped, and the heap is rebuilt when they dominate), plus a constant
three bands. With an ordering whose head changes by the passage of time alone (DPA) and `tokens`
mode, a tenant is re-keyed when it is touched or reaches the top of the heap; until then its place
reflects its head as of its last change.

Fast paths (a push and a pop per request; `bench/scheduler_decisions.py` measures them): a push
behind an unchanged head does not re-key (crediting visits never moves a live key, see `_rekey`);
heap entries carry their flow and are live only while the flow holds them (identity), so the top
is checked without a lookup; a flow re-keyed while its entry is the top replaces it in one sift;
costs live in the flow (no table of every queued request to touch); and DRR's default ordering
runs on `drr_queue.CostedQueue`: one table per flow for membership and cost, the requests
themselves (not entry tuples) kept while they arrive in key order, and a push behind the tail
re-keys nothing without asking for the head.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fleetwarden.api.enums import Ordering, QuantumUnit, Tier
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.drr_queue import (
    CostedQueue,
    priority_deadline_key,
    priority_deadline_queue,
)
from fleetwarden.fairness.ordering import RequestQueue, queue_factory
from fleetwarden.fairness.request import TIER_RANK, Request

DEFAULT_TOKEN_QUANTA = {Tier.IW_FAST: 4096, Tier.IW_NORMAL: 2048, Tier.NIW: 1024}
"""Tokens per visit for a tier the quantum table omits (the TenantPolicy defaults)."""
DEFAULT_REQUEST_QUANTUM = 1
"""Requests per visit for a tier the table omits: one request per tenant per round."""
_PER_REQUEST = QuantumUnit.REQUESTS

Ticket = tuple[int, int]
"""A flow's place in its band's cycle: (-round it joined for, join sequence). Newer cohorts sort
first (they join at the start of the next round), a cohort in join order."""
Entry = tuple[int, int, int, "_Flow"]
"""A heap entry: (fit round, *ticket, flow); tickets are unique, so flows are never compared."""


@dataclass(slots=True, eq=False)
class _Flow:
    """One tenant's queue in one band, and its DRR state."""

    tenant: str
    ticket: Ticket
    queue: RequestQueue
    next_round: int
    """Round of the first visit not yet credited to `deficit`."""
    deficit: int = 0
    entry: Entry | None = None
    """Its live entry in the band's heap (compared by identity: any other is stale); None once
    the flow has left."""
    head_seq: int = -1
    """Seq of the head the entry was computed for."""
    head_cost: int = 0
    """Cost of that head (with `head_static` queues, the current head's cost)."""
    costs: dict[int, int] = field(default_factory=dict)
    """Cost of every queued request, by seq, fixed at push. Kept per flow rather than in one
    table of every queued request: a dispatch then touches a small table it reaches anyway."""


@dataclass(slots=True)
class _Band:
    """The flows of one tier and the round-robin position among them."""

    quantum: int
    round: int = 0
    position: Ticket = (0, 0)
    """With `round`: the visit that happened last (initially before every flow)."""
    holder: _Flow | None = None
    """The flow whose turn is in progress: it dispatches again while its head fits."""
    flows: dict[str, _Flow] = field(default_factory=dict)
    heap: list[Entry] = field(default_factory=list)

    def next_visit(self, flow: _Flow) -> int:
        """Round of the flow's first visit after the current position."""
        return self.round if flow.ticket > self.position else self.round + 1

    def credit(self, flow: _Flow) -> None:
        """Credit the quanta of the visits the flow received since it was last touched."""
        upto = self.next_visit(flow)
        if upto > flow.next_round:
            flow.deficit += self.quantum * (upto - flow.next_round)
            flow.next_round = upto


class DeficitRoundRobin:
    """DRR across tenants inside strict tier bands. See the module docstring."""

    def __init__(
        self,
        quantum: Mapping[Tier, int] | None = None,
        *,
        unit: QuantumUnit = QuantumUnit.TOKENS,
        tiers: Mapping[str, Tier] | Callable[[str], Tier | None] | None = None,
        queue_factory: Callable[[], RequestQueue] = priority_deadline_queue,
    ) -> None:
        self.unit = unit
        defaults = (
            DEFAULT_TOKEN_QUANTA
            if unit is QuantumUnit.TOKENS
            else dict.fromkeys(Tier, DEFAULT_REQUEST_QUANTUM)
        )
        quanta = {**defaults, **(quantum or {})}
        if any(q < 1 for q in quanta.values()):
            raise ValueError(f"quanta must be >= 1, got {quanta}")
        self.quanta: dict[Tier, int] = quanta
        self._pinned: Callable[[str], Tier | None] | None
        if tiers is None:
            self._pinned = None  # no call at all per push
        elif callable(tiers):
            self._pinned = tiers
        else:
            table = dict(tiers)
            self._pinned = table.get
        self._costed = queue_factory is priority_deadline_queue
        """The default ordering: flows use `CostedQueue`, which orders the same way."""
        self._queue_factory: Callable[[], RequestQueue] = (
            CostedQueue if self._costed else queue_factory
        )
        probe = queue_factory()
        self._heads_stable = bool(getattr(probe, "head_stable_on_push", False))
        """FIFO: a push behind a queued head changes no head, so it changes no key."""
        self._heads_static = bool(getattr(probe, "head_static", False))
        """Heads move only by push, pop and remove, which re-key: a flow's head_seq stays true."""
        self._order = sorted(Tier, key=TIER_RANK.__getitem__)
        self._bands = {tier: _Band(quanta[tier]) for tier in self._order}
        self._band_order = [self._bands[tier] for tier in self._order]
        self._queued = 0
        self._joins = 0
        self._now = float("-inf")
        """The latest time seen; `remove` has no `now` of its own."""

    @classmethod
    def from_config(
        cls, config: FairnessConfig, *, queue_factory: Callable[[], RequestQueue] | None = None
    ) -> DeficitRoundRobin:
        """DRR as the sidecar config describes it: unit and quanta, every tenant pinned to its
        configured tier (`defaults.tier` if unlisted), and the config's ordering inside a tenant,
        `priority` meaning priority, then deadline, then arrival."""
        if queue_factory is None:
            if config.ordering is Ordering.PRIORITY:
                queue_factory = priority_deadline_queue
            else:
                queue_factory = _ordered(config)
        tenants, defaults = config.tenants, config.defaults
        return cls(
            config.drr.quantum,
            unit=config.drr.unit,
            tiers=lambda t: tenants.get(t, defaults).tier,
            queue_factory=queue_factory,
        )

    # -- inspection ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._queued

    def tier_of(self, request: Request) -> Tier:
        """The band a request queues in: its tenant's pinned tier, else its own."""
        pinned = None if self._pinned is None else self._pinned(request.tenant)
        return request.tier if pinned is None else pinned

    def cost(self, request: Request) -> int:
        """What dispatching the request takes out of its tenant's deficit."""
        if self.unit is _PER_REQUEST:
            return 1
        budget = request.predicted_output_tokens
        if budget is None:
            budget = request.max_output_tokens
        return max(0, request.input_tokens) + max(0, budget)

    def active_tenants(self, tier: Tier) -> list[str]:
        """Tenants with queued requests in a band, sorted for determinism."""
        return sorted(self._bands[tier].flows)

    def deficit(self, tenant: str, tier: Tier) -> int:
        """The tenant's deficit in a band now (every visit so far credited); 0 when inactive."""
        band = self._bands[tier]
        flow = band.flows.get(tenant)
        if flow is None:
            return 0
        upto = band.next_visit(flow)
        return flow.deficit + band.quantum * max(0, upto - flow.next_round)

    # -- the heap -----------------------------------------------------------------------------

    def _rekey(self, band: _Band, flow: _Flow, head: Request) -> None:
        """File the flow under the round its head next fits in, as if its turn had ended.

        Only a new head (push, pop, remove, or time under DPA) can change the key: crediting the
        visits that went by keeps `deficit + quantum * next_round` constant, and the position
        never passes a live key, so callers skip this when the head is the one filed."""
        band.credit(flow)
        self._file(band, flow, head)

    def _file(self, band: _Band, flow: _Flow, head: Request) -> None:
        """`_rekey` for a flow with every visit credited: the one whose turn is in progress
        (`pop`), whose next visit is the round after the current one, as it is credited to."""
        quantum = band.quantum
        seq = head.seq
        cost = flow.costs[seq]
        visits = -(-(cost - flow.deficit) // quantum)  # ceil(shortfall / quantum), at least 1
        fit_round = flow.next_round + visits - 1 if visits > 1 else flow.next_round
        flow.head_seq, flow.head_cost = seq, cost
        old = flow.entry
        if old is not None and old[0] == fit_round:
            return  # the ticket never changes: the same key, still live
        ticket = flow.ticket
        entry = (fit_round, ticket[0], ticket[1], flow)
        flow.entry = entry
        heap = band.heap
        if heap and heap[0] is old:
            heapq.heapreplace(heap, entry)  # the old entry is the top: replace it in one sift
        else:
            heapq.heappush(heap, entry)
            if len(heap) > 64 and len(heap) > 3 * len(band.flows):
                band.heap = [f.entry for f in band.flows.values() if f.entry is not None]
                heapq.heapify(band.heap)

    def _top(self, band: _Band, now: float) -> _Flow:
        """The flow whose visit comes first among those whose head would fit at it."""
        while True:
            heap = band.heap  # `_rekey` may rebuild it
            entry = heap[0]
            flow = entry[3]
            if flow.entry is not entry:  # superseded, or the flow left
                heapq.heappop(heap)
                continue
            if not self._heads_static:
                head = flow.queue.head(now)
                if head is not None and head.seq != flow.head_seq:
                    self._rekey(band, flow, head)  # the head changed with time alone (DPA)
                    continue
            return flow

    def _band(self, now: float) -> _Band | None:
        """The first band with queued work (strict tiers)."""
        if now > self._now:
            self._now = now
        for band in self._band_order:
            if band.flows:
                return band
        return None

    def _continues(self, holder: _Flow | None) -> bool:
        """Whether the flow whose turn is in progress dispatches again: its head still fits."""
        if holder is None:
            return False
        if self._heads_static:
            return holder.head_cost <= holder.deficit
        head = holder.queue.head(self._now)
        return head is not None and holder.costs[head.seq] <= holder.deficit

    def _leave(self, band: _Band, flow: _Flow) -> None:
        """The flow's queue emptied: it leaves the cycle and its deficit is forgotten."""
        del band.flows[flow.tenant]
        if band.holder is flow:
            band.holder = None
        if band.heap and band.heap[0] is flow.entry:
            heapq.heappop(band.heap)  # stale from now on; drop it while it is at hand
        flow.entry = None

    # -- the protocol -------------------------------------------------------------------------

    def push(self, request: Request, now: float) -> None:
        if now > self._now:
            self._now = now
        tenant, seq = request.tenant, request.seq
        pinned = None if self._pinned is None else self._pinned(tenant)
        tier = request.tier if pinned is None else pinned
        band = self._bands[tier]
        if self.unit is _PER_REQUEST:
            cost = 1
        else:  # `self.cost(request)` inlined, `max(0, n)` spelled out: pushes are hot
            budget = request.predicted_output_tokens
            if budget is None:
                budget = request.max_output_tokens
            tokens = request.input_tokens
            cost = (tokens if tokens > 0 else 0) + (budget if budget > 0 else 0)
        self._queued += 1
        flow = band.flows.get(tenant)
        if flow is None:
            joins = band.round + 1  # the start of the next round
            queue = self._queue_factory()
            flow = _Flow(tenant, (-joins, self._joins), queue, joins)
            if type(queue) is CostedQueue:
                flow.costs = queue.costs  # one table: the queue's membership is the costs'
            self._joins += 1
            band.flows[tenant] = flow
            flow.costs[seq] = cost
            flow.queue.push(request)
            self._rekey(band, flow, request)  # the only request is the head
            return
        flow.costs[seq] = cost
        queue = flow.queue
        if type(queue) is CostedQueue:
            if queue.push_behind(request):
                return  # behind a live head: no head changed, so no key did
        else:
            queue.push(request)
            if self._heads_stable:
                return
        head = queue.head(self._now)
        if head is not None and head.seq != flow.head_seq:
            self._rekey(band, flow, head)

    def peek(self, now: float) -> Request | None:
        band = self._band(now)
        if band is None:
            return None
        holder = band.holder
        flow = holder if self._continues(holder) else self._top(band, self._now)
        assert flow is not None
        return flow.queue.head(self._now)

    def pop(self, now: float) -> Request | None:
        band = self._band(now)
        if band is None:
            return None
        flow = band.holder
        if flow is None or not (
            flow.head_cost <= flow.deficit if self._heads_static else self._continues(flow)
        ):  # `_continues`, inlined for FIFO and priority orderings: no turn to continue
            flow = self._top(band, self._now)
            # The visits up to and including the fitting one, in one step; the turn starts.
            assert flow.entry is not None
            fit_round = flow.entry[0]
            flow.deficit += band.quantum * (fit_round - flow.next_round + 1)
            flow.next_round = fit_round + 1
            band.round, band.position, band.holder = fit_round, flow.ticket, flow
        queue = flow.queue
        request = queue.pop(self._now)
        self._queued -= 1
        flow.deficit -= flow.costs.pop(request.seq)
        head = queue.head(self._now)
        if head is None:
            self._leave(band, flow)
        else:
            self._file(band, flow, head)  # the turn's flow: nothing to credit
        return request

    def charge(
        self, request: Request, *, input_tokens: int = 0, output_tokens: int = 0, now: float
    ) -> None:
        """DRR pays its cost estimate at dispatch; see the module docstring for why no refunds."""

    def complete(self, request: Request, now: float) -> None:
        """Nothing to settle."""

    def remove(self, request: Request) -> bool:
        # A request's tenant and tier are fixed (request.py), so its flow is found again from
        # them; its band by a `tiers` callable whose answer may have changed is looked for too.
        band = self._bands[self.tier_of(request)]
        flow = band.flows.get(request.tenant)
        if flow is None or request.seq not in flow.costs:
            for band in self._band_order:
                flow = band.flows.get(request.tenant)
                if flow is not None and request.seq in flow.costs:
                    break
            else:
                return False
        if not flow.queue.remove(request):
            return False
        self._queued -= 1
        del flow.costs[request.seq]
        head = flow.queue.head(self._now)
        if head is None:
            self._leave(band, flow)
        else:
            self._rekey(band, flow, head)
        return True


def _ordered(config: FairnessConfig) -> Callable[[], RequestQueue]:
    return queue_factory(
        config.ordering,
        severely_expired_s=config.dpa.severely_expired_s,
        urgent_within_s=config.dpa.urgent_within_s,
    )


__all__ = ["DeficitRoundRobin", "priority_deadline_key", "priority_deadline_queue"]
