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
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fleetwarden.api.enums import Ordering, QuantumUnit, Tier
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.ordering import KeyedQueue, RequestQueue, queue_factory
from fleetwarden.fairness.request import TIER_RANK, Request

DEFAULT_TOKEN_QUANTA = {Tier.IW_FAST: 4096, Tier.IW_NORMAL: 2048, Tier.NIW: 1024}
"""Tokens per visit for a tier the quantum table omits (the TenantPolicy defaults)."""
DEFAULT_REQUEST_QUANTUM = 1
"""Requests per visit for a tier the table omits: one request per tenant per round."""

Ticket = tuple[int, int]
"""A flow's place in its band's cycle: (-round it joined for, join sequence). Newer cohorts sort
first (they join at the start of the next round), a cohort in join order."""


def priority_deadline_key(request: Request) -> tuple[float, ...]:
    """Tier priority first, then the earliest deadline (none: last); `KeyedQueue` adds arrival."""
    deadline = math.inf if request.deadline_s is None else request.deadline_s
    return (request.tier_rank, deadline)


def priority_deadline_queue() -> RequestQueue:
    return KeyedQueue(priority_deadline_key)


@dataclass(slots=True)
class _Flow:
    """One tenant's queue in one band, and its DRR state."""

    tenant: str
    ticket: Ticket
    queue: RequestQueue
    next_round: int
    """Round of the first visit not yet credited to `deficit`."""
    deficit: int = 0
    key: tuple[int, int, int] | None = None
    """(fit round, *ticket) as last filed in the band's heap."""
    head_seq: int = -1
    """Seq of the head the key was computed for."""


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
    heap: list[tuple[int, int, int, str]] = field(default_factory=list)

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
        if tiers is None:
            self._pinned: Callable[[str], Tier | None] = lambda _tenant: None
        elif callable(tiers):
            self._pinned = tiers
        else:
            table = dict(tiers)
            self._pinned = table.get
        self._queue_factory = queue_factory
        self._order = sorted(Tier, key=TIER_RANK.__getitem__)
        self._bands = {tier: _Band(quanta[tier]) for tier in self._order}
        self._where: dict[int, tuple[Tier, str]] = {}
        """Band and tenant of every queued request, by seq."""
        self._cost: dict[int, int] = {}
        """Cost of every queued request, by seq, fixed at push."""
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
        return len(self._where)

    def tier_of(self, request: Request) -> Tier:
        """The band a request queues in: its tenant's pinned tier, else its own."""
        pinned = self._pinned(request.tenant)
        return request.tier if pinned is None else pinned

    def cost(self, request: Request) -> int:
        """What dispatching the request takes out of its tenant's deficit."""
        if self.unit is QuantumUnit.REQUESTS:
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

    def _rekey(self, band: _Band, flow: _Flow, now: float) -> None:
        """File the flow under the round its head next fits in, as if its turn had ended."""
        band.credit(flow)
        head = flow.queue.head(now)
        assert head is not None, "an active flow has a head"
        shortfall = self._cost[head.seq] - flow.deficit
        visits = max(1, -(-shortfall // band.quantum))
        key = (flow.next_round + visits - 1, *flow.ticket)
        flow.head_seq = head.seq
        if key != flow.key:
            flow.key = key
            heapq.heappush(band.heap, (*key, flow.tenant))
            if len(band.heap) > 64 and len(band.heap) > 3 * len(band.flows):
                band.heap = [(*f.key, f.tenant) for f in band.flows.values() if f.key is not None]
                heapq.heapify(band.heap)

    def _top(self, band: _Band, now: float) -> _Flow:
        """The flow whose visit comes first among those whose head would fit at it."""
        while True:
            fit_round, t0, t1, tenant = band.heap[0]
            flow = band.flows.get(tenant)
            if flow is None or flow.key != (fit_round, t0, t1):
                heapq.heappop(band.heap)
                continue
            head = flow.queue.head(now)
            if head is not None and head.seq != flow.head_seq:
                self._rekey(band, flow, now)  # the head changed with time alone (DPA)
                continue
            return flow

    def _select(self, now: float) -> tuple[_Band, _Flow, bool] | None:
        """(band, flow, whether the flow continues its turn) of the next dispatch."""
        self._now = max(self._now, now)
        for tier in self._order:
            band = self._bands[tier]
            if not band.flows:
                continue
            holder = band.holder
            if holder is not None:
                head = holder.queue.head(self._now)
                if head is not None and self._cost[head.seq] <= holder.deficit:
                    return band, holder, True
            return band, self._top(band, self._now), False
        return None

    def _leave(self, band: _Band, flow: _Flow) -> None:
        """The flow's queue emptied: it leaves the cycle and its deficit is forgotten."""
        del band.flows[flow.tenant]
        if band.holder is flow:
            band.holder = None

    # -- the protocol -------------------------------------------------------------------------

    def push(self, request: Request, now: float) -> None:
        self._now = max(self._now, now)
        tier = self.tier_of(request)
        band = self._bands[tier]
        flow = band.flows.get(request.tenant)
        if flow is None:
            joins = band.round + 1  # the start of the next round
            flow = _Flow(request.tenant, (-joins, self._joins), self._queue_factory(), joins)
            self._joins += 1
            band.flows[request.tenant] = flow
        flow.queue.push(request)
        self._where[request.seq] = (tier, request.tenant)
        self._cost[request.seq] = self.cost(request)
        self._rekey(band, flow, self._now)

    def peek(self, now: float) -> Request | None:
        selected = self._select(now)
        return None if selected is None else selected[1].queue.head(self._now)

    def pop(self, now: float) -> Request | None:
        selected = self._select(now)
        if selected is None:
            return None
        band, flow, continuing = selected
        if not continuing:
            # The visits up to and including the fitting one, in one step; the turn starts.
            assert flow.key is not None
            fit_round = flow.key[0]
            flow.deficit += band.quantum * (fit_round - flow.next_round + 1)
            flow.next_round = fit_round + 1
            band.round, band.position, band.holder = fit_round, flow.ticket, flow
        request = flow.queue.pop(self._now)
        del self._where[request.seq]
        flow.deficit -= self._cost.pop(request.seq)
        if len(flow.queue) == 0:
            self._leave(band, flow)
        else:
            self._rekey(band, flow, self._now)
        return request

    def charge(
        self, request: Request, *, input_tokens: int = 0, output_tokens: int = 0, now: float
    ) -> None:
        """DRR pays its cost estimate at dispatch; see the module docstring for why no refunds."""

    def complete(self, request: Request, now: float) -> None:
        """Nothing to settle."""

    def remove(self, request: Request) -> bool:
        where = self._where.get(request.seq)
        if where is None:
            return False
        band = self._bands[where[0]]
        flow = band.flows[where[1]]
        if not flow.queue.remove(request):
            return False
        del self._where[request.seq]
        del self._cost[request.seq]
        if len(flow.queue) == 0:
            self._leave(band, flow)
        else:
            self._rekey(band, flow, self._now)
        return True


def _ordered(config: FairnessConfig) -> Callable[[], RequestQueue]:
    return queue_factory(
        config.ordering,
        severely_expired_s=config.dpa.severely_expired_s,
        urgent_within_s=config.dpa.urgent_within_s,
    )
