"""FairServe's Weighted Service Counter (Khan et al., section 4.3, Eq. 2 and 3).

VTC gives every user equal tokens; FairServe argues that equal tokens are not fair when users work
in applications with different typical lengths (section 3.2: 5 tokens are half of an app-A request
of 10 tokens but a tenth of an app-B request of 50). WSC therefore measures service as the fraction
of an *expected* request that was served:

    w_aj      = alpha * N_I + beta * N_S + gamma * N_O                      (Eq. 2)
    increment = E_i * (alpha * L_I + beta * L_S + gamma * L_O) / w_aj       (Eq. 3, per request)

where N_* are the expected user-input, system and output tokens of application `a` at interaction
stage `j` (from historical data: the config's application stages), L_* the tokens actually served,
alpha = 1, beta = 2, gamma = 1 by default (the paper's values), and E_i the user's priority factor.
E multiplies service, so E < 1 makes a user look less served than it is: E < 1 means preference.

Where the paper leaves room, this implementation decides:

- Unknown application or stage (or a stage whose w_aj is 0 under the chosen weights): the
  normaliser is `default_normaliser`, 1.0 unless configured, i.e. raw weighted tokens. Such a user is
  charged on a scale hundreds of times larger than a user of a configured app (whose requests count
  about 1 each), so configure every application that shares a pod, or set a default near a typical
  w_aj.
- Tenant weights (the project's `weight`, which weighted VTC divides by) also divide WSC's charges,
  so one setting means "share of service" under both policies. Both E and weight default to 1.
- A user joining the queue is lifted like VTC (to the least counter among queued users, or, with an
  empty queue, to the counter of the last user to leave): the paper says so, "a counter adjustment
  takes place ... similar to prior research" (section 4.3, Alg. 1 lines 12-18).
- Input (user + system) is charged at dispatch in `pop`, output per generated token in `charge`,
  as the protocol in `request.py` fixes. The paper updates counters once prefill and decode are
  done (Alg. 1 lines 40-48); the totals are the same, but charging as service is delivered lets a
  burst of selections in one step see the counters move (as in VTC). An input correction in
  `charge(input_tokens=...)` is priced as user input (alpha): the system prompt is what the shell
  knows exactly.

Selection (section 4.3, Alg. 1 lines 31-39): queued continuations of interactions already in
flight (`request.continuation`) go first, from the least-served user among those that have one;
only when none is queued does the least-served user dispatch its earliest new request. Within a
user, `queue_factory` orders each kind (FIFO by default: the earliest). Continuations deliberately
override the counter order, so the VTC-style bound on the counter gap holds for new interactions,
not while one user keeps its interactions running.

Complexity: one heap of (counter, head seq, user) entries per kind, kept lazily as in `vtc.py`:
a user's entry is filed when its head of that kind changes (push, pop, remove), and its counter
is only a lower bound, since counters grow with every charge; an outdated counter is re-keyed when
the entry reaches the top. A charge is then O(1) and touches no heap, and push, pop, peek and
remove are O(log n) amortised in users and queued requests. With an ordering whose head moves with
time alone (DPA) the heads are re-read whenever a user is touched, exactly when the earlier eager
version of this class re-filed them, so the choice of user is the same as it was. Each user's queue
of a kind is a `Lane` record (`wsc_lanes`) that its heap entries point at (no lookups on a dispatch), and with
no stages, E or weights configured the scale is computed inline (the fast paths are described
where they are; `tests/fairness/test_fast_paths.py` checks selection against a scan).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from heapq import heappop, heapreplace

from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.left_floor import LeftFloor
from fleetwarden.fairness.ordering import FifoQueue, RequestQueue
from fleetwarden.fairness.ordering import queue_factory as ordered_queues
from fleetwarden.fairness.request import Request
from fleetwarden.fairness.wsc_lanes import Entry, Kind, Lane

MAX_MEMOISED_SCALES = 65_536
"""Entries the per-(user, app, stage) scale memo holds before it starts over."""

StageExpectations = Mapping[str, Mapping[str, Mapping[str, float]]]
"""app -> stage -> {"input": N_I, "system": N_S, "output": N_O}; a missing kind counts 0."""


@dataclass(frozen=True, slots=True)
class ServiceWeights:
    """FairServe's alpha, beta, gamma: what one user-input, system and output token counts."""

    input: float = 1.0
    system: float = 2.0
    output: float = 1.0


def _lookup(
    table: Mapping[str, float] | Callable[[str], float] | None, default: float
) -> Callable[[str], float]:
    if table is None:
        return lambda _tenant: default
    if callable(table):
        return table
    frozen = dict(table)
    return lambda tenant: frozen.get(tenant, default)


class WeightedServiceCounter(LeftFloor):
    """FairServe's WSC scheduler. See the module docstring; the empty-queue floor, and its
    survival of `forget`, are `LeftFloor`'s (as in VTC)."""

    def __init__(
        self,
        token_weights: ServiceWeights | None = None,
        *,
        stages: StageExpectations | None = None,
        priority_factors: Mapping[str, float] | Callable[[str], float] | None = None,
        weights: Mapping[str, float] | Callable[[str], float] | None = None,
        default_normaliser: float = 1.0,
        queue_factory: Callable[[], RequestQueue] = FifoQueue,
    ) -> None:
        if default_normaliser <= 0:
            raise ValueError(f"default_normaliser must be > 0, got {default_normaliser}")
        super().__init__()
        self.token_weights = token_weights or ServiceWeights()
        self.default_normaliser = default_normaliser
        tw = self.token_weights
        self._normalisers: dict[tuple[str, str], float] = {}
        for app, app_stages in (stages or {}).items():
            for stage, expected in app_stages.items():
                w_aj = (
                    tw.input * expected.get("input", 0)
                    + tw.system * expected.get("system", 0)
                    + tw.output * expected.get("output", 0)
                )
                if w_aj > 0:
                    self._normalisers[(app, stage)] = float(w_aj)
        self._factor = _lookup(priority_factors, 1.0)
        self._weight = _lookup(weights, 1.0)
        self._scales: dict[tuple[str, str | None, str | None], float] | None = (
            None if callable(priority_factors) or callable(weights) else {}
        )
        """Memo of `_scale` by (tenant, app, stage), kept only while E and weight are known to be
        pure lookups (tables, or a frozen config's): it runs once per charged token event, and
        computing it costs two lookups and a division every time. The memoised float is the one
        `_scale` computes, so no counter changes."""
        self._unit_scale = priority_factors is None and weights is None
        """No E and no weight: every user's scale is 1 / w_aj, with no lookups."""
        self._plain = self._unit_scale and not self._normalisers
        """Nor any stage: every request's scale is 1 / default_normaliser (the common case, so
        `pop` and `charge` compute it inline instead of calling `_scale`)."""
        self._queue_factory = queue_factory
        probe = queue_factory()
        self._heads_stable = bool(getattr(probe, "head_stable_on_push", False))
        """FIFO: a push behind a queued head changes no head, so it files nothing."""
        self._heads_static = bool(getattr(probe, "head_static", False))
        """Heads move only by push, pop and remove (not DPA): a filed head seq stays true."""
        self.counters: dict[str, float] = {}
        self._continuations = Kind()
        self._new = Kind()
        self._queued = 0
        self._now = float("-inf")
        """The latest time seen; `remove` has no `now` of its own."""

    @classmethod
    def from_config(
        cls,
        config: FairnessConfig,
        *,
        queue_factory: Callable[[], RequestQueue] | None = None,
    ) -> WeightedServiceCounter:
        """WSC as the sidecar config describes it: token weights, stages, E and weight per tenant
        (unlisted tenants take `config.defaults`), and the config's ordering inside a user."""
        tenants, defaults = config.tenants, config.defaults
        plain = all(t.priority_factor == 1 and t.weight == 1 for t in [defaults, *tenants.values()])
        stages = {
            app: {name: s.model_dump() for name, s in spec.stages.items()}
            for app, spec in config.applications.items()
        }
        if queue_factory is None:
            queue_factory = ordered_queues(
                config.ordering,
                severely_expired_s=config.dpa.severely_expired_s,
                urgent_within_s=config.dpa.urgent_within_s,
            )
        policy = cls(
            ServiceWeights(
                input=config.token_weights.input,
                system=config.token_weights.system,
                output=config.token_weights.output,
            ),
            stages=stages,
            # Everyone at E = weight = 1 (the usual case): no lookups per token (same figures).
            priority_factors=None if plain else lambda t: tenants.get(t, defaults).priority_factor,
            weights=None if plain else lambda t: tenants.get(t, defaults).weight,
            queue_factory=queue_factory,
        )
        policy._scales = {}  # the config is frozen: its lookups are pure, so scales may be memoised
        return policy

    # -- service accounting -------------------------------------------------------------------

    def normaliser(self, request: Request) -> float:
        """w_aj of the request's application and stage, or the default when either is unknown."""
        if request.app is None or request.stage is None:
            return self.default_normaliser
        return self._normalisers.get((request.app, request.stage), self.default_normaliser)

    def _scale(self, request: Request) -> float:
        """What one unit of weighted tokens adds to the user's counter: E / (w_aj * weight)."""
        scales = self._scales
        if scales is not None:
            key = (request.tenant, request.app, request.stage)
            scale = scales.get(key)
            if scale is None:
                if len(scales) >= MAX_MEMOISED_SCALES:
                    scales.clear()  # one-off users must not grow it without bound
                scale = scales[key] = self._compute_scale(request)
            return scale
        return self._compute_scale(request)

    def _compute_scale(self, request: Request) -> float:
        # With no stage configured every request has the default: no call per token.
        normaliser = self.normaliser(request) if self._normalisers else self.default_normaliser
        if self._unit_scale:
            return 1.0 / normaliser  # E = weight = 1, the same float as 1.0 / (w_aj * 1.0)
        tenant = request.tenant
        return self._factor(tenant) / (normaliser * self._weight(tenant))

    # -- queue membership ---------------------------------------------------------------------

    def __len__(self) -> int:
        return self._queued

    def queued_tenants(self) -> list[str]:
        """Users with at least one queued request, sorted for determinism."""
        kinds = (self._continuations, self._new)
        return sorted({n for k in kinds for n, lane in k.lanes.items() if lane.entry is not None})

    def _queued_user(self, tenant: str) -> bool:
        return self._new.queued(tenant) or self._continuations.queued(tenant)

    def _touch(self, tenant: str, *, rekey: bool = False) -> None:
        """Re-read the user's heads (after a change a filed head seq may not reflect: a push under
        an ordering that can put it first, or time passing under DPA) and re-file those that
        moved; with `rekey` (its counter went down) re-file both, so keys stay lower bounds."""
        counter, now = self.counters[tenant], self._now
        for kind in (self._continuations, self._new):
            lane = kind.lanes.get(tenant)
            if lane is None or lane.entry is None:
                continue
            head = lane.queue.head(now)
            if head is None:  # not reachable while entries track membership; stay safe
                kind.unfile(lane)
            elif rekey or head.seq != lane.entry[1]:
                kind.file(lane, counter, head.seq)

    def min_queued_counter(self) -> float | None:
        """The least counter among users with queued requests of either kind."""
        counters = self.counters
        least: float | None = None
        for kind in (self._continuations, self._new):
            entry = kind.top(counters)
            if entry is not None and (least is None or entry[0] < least):
                least = entry[0]  # the first of equal ones, as `min` keeps
        return least

    def _select(self) -> tuple[Kind, Entry] | None:
        """Continuations first, from the least-served user that has one; else new requests."""
        counters = self.counters
        for kind in (self._continuations, self._new):
            if kind.live:  # skip the call for a kind nobody has queued
                entry = kind.top(counters)
                if entry is not None:
                    return kind, entry
        return None

    # -- the protocol -------------------------------------------------------------------------

    def push(self, request: Request, now: float) -> None:
        tenant = request.tenant
        kind = self._continuations if request.continuation else self._new
        lane = kind.lanes.get(tenant)
        if lane is not None and lane.entry is not None:  # queued in this kind: no lift
            if now > self._now:
                self._now = now
            lane.queue.push(request)
            self._queued += 1
            if not self._heads_stable:
                self._touch(tenant)
            return
        counters = self.counters
        counter = counters.setdefault(tenant, 0.0)
        # The VTC lift (FairServe Alg. 1, lines 12-18) for a user not queued in either kind (not
        # in this one, as checked above): no credit for time spent away.
        if self._queued == 0:  # nobody is queued: lift to the last user to leave
            left = self._left_counter()
            if left is not None:
                counter = counters[tenant] = max(counter, left)
        else:
            other = self._new if kind is self._continuations else self._continuations
            if not other.queued(tenant):
                floor = self.min_queued_counter()
                if floor is not None:
                    counter = counters[tenant] = max(counter, floor)
        if lane is None:
            lane = kind.lanes[tenant] = Lane(tenant, self._queue_factory())
        lane.queue.push(request)
        self._queued += 1
        if now > self._now:
            self._now = now
        kind.file(lane, counter, request.seq)  # the only request of its kind is its head
        if not self._heads_static:
            self._touch(tenant)

    def peek(self, now: float) -> Request | None:
        selected = self._select()
        return None if selected is None else selected[1][2].queue.head(now)

    def pop(self, now: float) -> Request | None:
        # `_select`, inlined: continuations first, else new requests.
        counters = self.counters
        kind = self._continuations
        entry = kind.top(counters) if kind.live else None
        if entry is None:
            kind = self._new
            entry = kind.top(counters) if kind.live else None
            if entry is None:
                return None
        lane = entry[2]
        tenant, queue = lane.name, lane.queue
        request = queue.pop(now)
        self._queued -= 1
        self._last_left = tenant
        amount = self._dispatch_amount(request)
        counter = counters[tenant] + amount
        counters[tenant] = counter
        if now > self._now:
            self._now = now
        head = queue.head(self._now)
        heap = kind.heap
        if heap[0] is not entry:  # only if a callback above re-entered the policy
            if head is None:
                kind.unfile(lane)
            else:
                kind.file(lane, counter, head.seq)
        elif head is None:
            heappop(heap)
            kind.unfile(lane)
        else:  # re-file in place: the top is this lane's own entry, now outdated
            entry = lane.entry = (counter, head.seq, lane)
            heapreplace(heap, entry)
        if amount < 0 or not self._heads_static:
            self._touch(tenant, rekey=amount < 0)
        return request

    def _dispatch_amount(self, request: Request) -> float:
        """What dispatching `request` adds to its user's counter: its input, user tokens at alpha
        and system tokens at beta, normalised (Eq. 3)."""
        tw = self.token_weights
        system = request.system_tokens
        user_input = request.input_tokens - system  # `request.user_input_tokens`, inlined
        weighted = tw.input * (user_input if user_input > 0 else 0) + tw.system * system
        if self._plain:
            return weighted * (1.0 / self.default_normaliser)  # `_scale`, inlined
        return weighted * self._scale(request)

    def push_pop(self, request: Request, now: float) -> None:
        """`push(request, now)` then `pop(now)` on an empty policy, which dispatches exactly that
        request: the same counters and the same later decisions, without filing the user in a
        heap and taking it out again. For a shell that finds its queue empty and the engine free
        when a request arrives (the usual case below saturation). `now` is the dispatch time; the
        push's own time, no later, would change nothing here (nobody else is queued, so the lift
        reads only the last user to leave, and a lone request is its lane's head at any time).
        `tests/fairness/test_push_pop.py` checks it against `push` and `pop`."""
        if self._queued:
            raise ValueError("push_pop needs an empty policy: push, then pop")
        tenant = request.tenant
        kind = self._continuations if request.continuation else self._new
        if tenant not in kind.lanes:  # as `push` would create it
            kind.lanes[tenant] = Lane(tenant, self._queue_factory())
        counters = self.counters
        counter = counters.get(tenant, 0.0)
        left = self._left_counter()
        if left is not None:  # the lift of a user joining an empty queue
            counter = max(counter, left)
        if now > self._now:
            self._now = now
        self._last_left = tenant
        amount = self._dispatch_amount(request)
        counters[tenant] = counter + amount

    def charge(
        self, request: Request, *, input_tokens: int = 0, output_tokens: int = 0, now: float
    ) -> None:
        """Charge generated tokens (gamma) and input corrections (alpha), normalised by w_aj."""
        tw = self.token_weights
        weighted = tw.input * input_tokens + tw.output * output_tokens
        if weighted:
            tenant = request.tenant
            scales = self._scales
            if self._plain:
                amount = weighted * (1.0 / self.default_normaliser)  # `_scale`, inlined
            elif scales is not None:  # `_scale`'s memo hit, inlined: this runs for every charge
                scale = scales.get((tenant, request.app, request.stage))
                amount = weighted * (scale if scale is not None else self._scale(request))
            else:
                amount = weighted * self._scale(request)
            counters = self.counters
            counters[tenant] = counters.get(tenant, 0.0) + amount
            # A queued user's entries need work only for a counter that went down or a head
            # that may have moved with time. Otherwise `_now` need not move either: with static
            # heads it is only ever passed to `head`, which ignores it.
            if (amount < 0 or not self._heads_static) and self._queued_user(tenant):
                if now > self._now:
                    self._now = now
                self._touch(tenant, rekey=amount < 0)

    def complete(self, request: Request, now: float) -> None:
        """Nothing to settle: WSC charges tokens as they are served, without predictions."""

    def forget(self, tenant: str) -> None:
        """Drop an idle user's counter and lanes (`fairness.idle`; as `VirtualTokenCounter.forget`:
        nothing queued or running, and its next request joins as a new user's would)."""
        if self._queued_user(tenant):
            raise ValueError(f"user {tenant!r} has queued requests and cannot be forgotten")
        self._forget_counter(tenant)  # the floor outlives it if it was the last to leave
        self._new.lanes.pop(tenant, None)  # WSC's own records: a lane per kind
        self._continuations.lanes.pop(tenant, None)

    def remove(self, request: Request) -> bool:
        tenant = request.tenant
        kinds = (self._continuations, self._new)
        for kind in kinds if request.continuation else reversed(kinds):
            lane = kind.lanes.get(tenant)
            if lane is None or not lane.queue.remove(request):
                continue
            self._queued -= 1
            head = lane.queue.head(self._now)
            if head is None:
                kind.unfile(lane)
            elif lane.entry is None or head.seq != lane.entry[1]:
                kind.file(lane, self.counters[tenant], head.seq)
            if not self._heads_static:
                self._touch(tenant)
            return True
        return False
