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

Complexity: one lazily invalidated heap of (counter, head seq) per kind, as in `vtc.py`; push, pop,
peek, charge and remove are O(log n) amortised in users and queued requests.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.ordering import FifoQueue, RequestQueue
from fleetwarden.fairness.ordering import queue_factory as ordered_queues
from fleetwarden.fairness.request import Request

StageExpectations = Mapping[str, Mapping[str, Mapping[str, float]]]
"""app -> stage -> {"input": N_I, "system": N_S, "output": N_O}; a missing kind counts 0."""


@dataclass(frozen=True)
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


class _LeastServed:
    """Users keyed by (counter, seq of their head), least first; stale entries skipped lazily.

    `update` files a user's current key (None: the user has nothing of this kind queued); entries
    left behind by earlier keys are dropped when they reach the top, and the heap is rebuilt from
    the live keys when they dominate, so it never grows beyond a constant times the live users.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._live: dict[str, tuple[float, int]] = {}

    def update(self, tenant: str, key: tuple[float, int] | None) -> None:
        if key is None:
            self._live.pop(tenant, None)
        else:
            self._live[tenant] = key
            heapq.heappush(self._heap, (key[0], key[1], tenant))
        if len(self._heap) > 64 and len(self._heap) > 3 * len(self._live):
            self._heap = [(c, s, t) for t, (c, s) in self._live.items()]
            heapq.heapify(self._heap)

    def top(self) -> str | None:
        heap = self._heap
        while heap:
            counter, seq, tenant = heap[0]
            if self._live.get(tenant) == (counter, seq):
                return tenant
            heapq.heappop(heap)
        return None


class WeightedServiceCounter:
    """FairServe's WSC scheduler. See the module docstring."""

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
        self._queue_factory = queue_factory
        self.counters: dict[str, float] = {}
        self._queues: dict[tuple[str, bool], RequestQueue] = {}
        """Per (user, continuation?) queue."""
        self._heaps = {True: _LeastServed(), False: _LeastServed()}
        self._queued_by_tenant: dict[str, int] = {}
        self._kind: dict[int, bool] = {}
        """Continuation flag of each queued request (by seq) as it was when pushed."""
        self._queued = 0
        self._last_left: str | None = None
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
        return cls(
            ServiceWeights(
                input=config.token_weights.input,
                system=config.token_weights.system,
                output=config.token_weights.output,
            ),
            stages=stages,
            priority_factors=lambda t: tenants.get(t, defaults).priority_factor,
            weights=lambda t: tenants.get(t, defaults).weight,
            queue_factory=queue_factory,
        )

    # -- service accounting -------------------------------------------------------------------

    def normaliser(self, request: Request) -> float:
        """w_aj of the request's application and stage, or the default when either is unknown."""
        if request.app is None or request.stage is None:
            return self.default_normaliser
        return self._normalisers.get((request.app, request.stage), self.default_normaliser)

    def _scale(self, request: Request) -> float:
        """What one unit of weighted tokens adds to the user's counter: E / (w_aj * weight)."""
        tenant = request.tenant
        return self._factor(tenant) / (self.normaliser(request) * self._weight(tenant))

    def _add(self, tenant: str, amount: float, now: float) -> None:
        self.counters[tenant] = self.counters.get(tenant, 0.0) + amount
        if self._queued_by_tenant.get(tenant, 0):
            self._refresh(tenant, now)

    # -- queue membership ---------------------------------------------------------------------

    def __len__(self) -> int:
        return self._queued

    def queued_tenants(self) -> list[str]:
        """Users with at least one queued request, sorted for determinism."""
        return sorted(t for t, n in self._queued_by_tenant.items() if n)

    def _refresh(self, tenant: str, now: float) -> None:
        """Re-file the user in both heaps after its counter or one of its heads changed."""
        self._now = max(self._now, now)
        for continuation, heap in self._heaps.items():
            queue = self._queues.get((tenant, continuation))
            head = queue.head(self._now) if queue is not None else None
            heap.update(tenant, None if head is None else (self.counters[tenant], head.seq))

    def min_queued_counter(self) -> float | None:
        """The least counter among users with queued requests of either kind."""
        tops = [t for h in self._heaps.values() if (t := h.top()) is not None]
        return min((self.counters[t] for t in tops), default=None)

    def _select(self) -> tuple[str, bool] | None:
        for continuation in (True, False):
            tenant = self._heaps[continuation].top()
            if tenant is not None:
                return tenant, continuation
        return None

    # -- the protocol -------------------------------------------------------------------------

    def push(self, request: Request, now: float) -> None:
        tenant = request.tenant
        self.counters.setdefault(tenant, 0.0)
        if not self._queued_by_tenant.get(tenant, 0):
            # The VTC lift (FairServe Alg. 1, lines 12-18): no credit for time spent away.
            if self._queued == 0:
                floor = None if self._last_left is None else self.counters[self._last_left]
            else:
                floor = self.min_queued_counter()
            if floor is not None:
                self.counters[tenant] = max(self.counters[tenant], floor)
        key = (tenant, request.continuation)
        self._kind[request.seq] = request.continuation
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = self._queue_factory()
        queue.push(request)
        self._queued_by_tenant[tenant] = self._queued_by_tenant.get(tenant, 0) + 1
        self._queued += 1
        self._refresh(tenant, now)

    def peek(self, now: float) -> Request | None:
        selected = self._select()
        return None if selected is None else self._queues[selected].head(now)

    def pop(self, now: float) -> Request | None:
        selected = self._select()
        if selected is None:
            return None
        tenant = selected[0]
        request = self._queues[selected].pop(now)
        del self._kind[request.seq]
        self._queued -= 1
        self._queued_by_tenant[tenant] -= 1
        self._last_left = tenant
        tw = self.token_weights
        user_input = max(0, request.user_input_tokens)
        weighted = tw.input * user_input + tw.system * request.system_tokens
        self.counters[tenant] += weighted * self._scale(request)
        self._refresh(tenant, now)
        return request

    def charge(
        self, request: Request, *, input_tokens: int = 0, output_tokens: int = 0, now: float
    ) -> None:
        """Charge generated tokens (gamma) and input corrections (alpha), normalised by w_aj."""
        tw = self.token_weights
        weighted = tw.input * input_tokens + tw.output * output_tokens
        if weighted:
            self._add(request.tenant, weighted * self._scale(request), now)

    def complete(self, request: Request, now: float) -> None:
        """Nothing to settle: WSC charges tokens as they are served, without predictions."""

    def remove(self, request: Request) -> bool:
        continuation = self._kind.get(request.seq)
        if continuation is None:
            return False
        queue = self._queues[(request.tenant, continuation)]
        if not queue.remove(request):
            return False
        del self._kind[request.seq]
        self._queued -= 1
        self._queued_by_tenant[request.tenant] -= 1
        self._refresh(request.tenant, self._now)
        return True
