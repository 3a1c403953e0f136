"""One serving instance of the simulated fleet: an engine model plus the pod's scheduling policy,
driven event by event.

The instance follows `fleetwarden.sim.replay`'s loop exactly; only the way time advances differs.
The replay loop runs one iteration per decode step: ingest arrivals, admit (prefill) when the
engine allows, then one decode step. Between two iterations that change something, every
iteration is a plain decode step with the same batch, so the instance computes the time of the
next iteration that matters and sleeps until then:

- the step at which the first running request finishes;
- the step at which an admission is allowed (idle, or `k` decode steps since the last), if
  requests are queued and the head might be admitted. After a failed attempt the head is not
  tried again until a completion, an arrival, or the first step at which it would fit (a
  candidate's staggered peak moves as the batch progresses; `PeakIndex.first_fit` finds that
  step), unless the policy's head moves by itself (counter policies, whose head changes as
  running requests are charged; DPA, whose head changes with the clock): those are tried at
  every allowed step, as the replay loop does;
- the first step boundary at or after a request routed here arrives (it is ingested there).

Step times follow the engine's own formula (a step takes c + d * batch + e * tokens held), summed
in closed form over a stretch of steps, so a stretch costs O(1) however long it is; times equal
the replay loop's step-by-step sums up to floating-point rounding (the parity test holds them to
1e-9 s).

Output tokens are charged to the policy lazily: before the policy compares or lifts tenants'
counters (a push of a tenant not yet queued, a dispatch, a completion), the pending tokens of
exactly the tenants whose counters it may read are charged, all at once. Counters are then what
they would have been step by step at every moment the policy reads them.

Departures from the replay loop, both for a fleet: a request that can never fit the KV budget is
refused by the router up front instead of blocking the queue until the engine is idle; and when
every request of a prefill finishes at the prefill (one-token outputs) the loop tries to admit
again instead of rejecting the next head.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from enum import IntEnum
from typing import Protocol

from fleetwarden.fairness.prediction import MovingAverage
from fleetwarden.fairness.request import Request, SchedulingPolicy
from fleetwarden.sim.engine import EngineProfile
from fleetwarden.sim.fleet_engine import FleetEngine
from fleetwarden.sim.job import Job as Job  # where the other modules have always found it


class Host(Protocol):
    """What an instance tells the fleet around it."""

    def schedule(self, instance: Instance, at: float) -> None: ...

    def completed(self, job: Job, now: float) -> None: ...

    def rejected(self, job: Job, now: float) -> None: ...

    def stopped(self, instance: Instance, now: float) -> None: ...


class State(IntEnum):
    LOADING = 0
    READY = 1
    DRAINING = 2
    STOPPED = 3


class Instance:
    """An engine instance with its policy; see the module docstring for how it is driven."""

    __slots__ = (
        "admit_every",
        "blocked",
        "blocked_on",
        "budget",
        "by_tenant",
        "charges_matter",
        "clean_at",
        "decode_base_s",
        "decode_per_request_s",
        "dynamic_head",
        "endpoint",
        "engine",
        "gpus",
        "host",
        "iid",
        "inbox",
        "jobs",
        "last_popped",
        "launched_s",
        "now",
        "origin_t",
        "plan_cb",
        "plan_steps",
        "policy",
        "predictor",
        "prefill_cap",
        "push_pop",
        "queued_tokens",
        "ready_s",
        "reclaimed",
        "state",
        "stopped_s",
        "version",
        "waiting",
        "waking",
    )

    def __init__(
        self,
        iid: int,
        endpoint: tuple[str, str],
        profile: EngineProfile,
        policy: SchedulingPolicy,
        host: Host,
        *,
        launched_s: float,
        ready_s: float,
        gpus: int = 1,
        dynamic_head: bool = True,
        charges_matter: bool = True,
        reclaimed: bool = False,
        predictor: MovingAverage | None = None,
    ) -> None:
        self.iid = iid
        self.endpoint = endpoint
        """(model key, pool)."""
        self.engine = FleetEngine(profile)
        # The profile's constants, read on every event (an attribute, not a chain of them).
        self.budget = profile.kv_budget_tokens
        self.admit_every = profile.admit_every_decode_steps
        self.prefill_cap = profile.prefill_cap_tokens
        self.decode_base_s = profile.decode_base_s
        self.decode_per_request_s = profile.decode_per_request_s
        self.policy = policy
        self.push_pop: Callable[[Request, float], None] | None = getattr(policy, "push_pop", None)
        """The policy's `push` then `pop` into an empty queue in one call, if it offers that."""
        self.host = host
        self.launched_s = launched_s
        self.ready_s = ready_s
        self.stopped_s = math.inf
        self.gpus = gpus
        self.reclaimed = reclaimed
        self.predictor = predictor
        """The pod's per-tenant output-length average, if its policy predicts lengths."""
        self.dynamic_head = dynamic_head
        self.charges_matter = charges_matter
        self.state = State.LOADING if ready_s > launched_s else State.READY
        self.now = ready_s
        self.inbox: deque[Job] = deque()
        self.jobs: dict[int, Job] = {}
        """Queued jobs by request seq (the policy hands back requests)."""
        self.queued_tokens = 0
        self.blocked = False
        self.blocked_on: Request | None = None
        """The head refused at the last attempt (static heads: it stays the head)."""
        self.version = 0
        self.plan_steps = 0
        self.plan_cb = 0.0
        self.origin_t = ready_s
        self.waking = False
        self.by_tenant: dict[str, list[Job]] = {}
        """Running requests per tenant (lazy charging goes tenant by tenant)."""
        self.clean_at: dict[str, int] = {}
        """Decode-step count at which each tenant's running requests were last charged."""
        self.waiting: dict[str, int] = {}
        """Requests queued in the policy, per tenant: non-empty exactly when the policy is (every
        push and every pop or removal goes through this instance), so it answers `len(policy)`
        without a call."""
        self.last_popped: str | None = None

    # -- what the router and the scaler read -----------------------------------------------------

    def load_tokens(self) -> int:
        """KV tokens committed: the running batch at its final size plus everything queued."""
        return self.engine.committed + self.queued_tokens

    def queued(self) -> int:
        return len(self.inbox) + len(self.policy)

    def backlogged(self) -> bool:
        """`queued() > 0` without calls (`waiting` is non-empty exactly when the policy is)."""
        return bool(self.inbox or self.waiting)

    def idle(self) -> bool:
        return not self.engine.running and not self.inbox and not self.waiting

    def held_at(self, t: float) -> int:
        """KV tokens held at the last step boundary at or before `t` (for utilisation)."""
        engine = self.engine
        if not self.plan_steps or t <= self.origin_t:
            return engine.held
        origin, cb = self.origin_t, self.plan_cb
        j = engine.first_boundary(origin, cb, t, self.plan_steps)
        if engine.boundary_time(origin, cb, j) > t:
            j -= 1
        return engine.held + j * len(engine.running)

    def utilisation(self, t: float) -> float:
        engine = self.engine  # `held_at`, inlined: the router's throttle asks on every request
        if not self.plan_steps or t <= self.origin_t:
            return engine.held / self.budget
        origin, cb = self.origin_t, self.plan_cb
        j = engine.first_boundary(origin, cb, t, self.plan_steps)
        if engine.boundary_time(origin, cb, j) > t:
            j -= 1
        return (engine.held + j * len(engine.running)) / self.budget

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, now: float) -> None:
        """The model finished loading: the instance serves from `now`."""
        self.state = State.READY
        self.now = now

    def drain(self, now: float) -> None:
        """Stop taking requests; stop once everything here has finished."""
        self.state = State.DRAINING
        if self.idle() and not self.waking:
            self._stop(max(now, self.now))

    def cancel(self, now: float) -> None:
        """Stop a loading instance (it never served)."""
        self.state = State.STOPPED
        self.stopped_s = now

    def _stop(self, now: float) -> None:
        self.state = State.STOPPED
        self.stopped_s = now
        self.host.stopped(self, now)

    # -- requests --------------------------------------------------------------------------------

    def enqueue(self, job: Job, t: float) -> None:
        """A request routed here at `t` (>= the time of every event processed so far)."""
        self.inbox.append(job)
        self.queued_tokens += job.tokens
        if self.plan_steps:
            # `_cut`, inlined: this runs for every routed request.
            engine, origin, cb = self.engine, self.origin_t, self.plan_cb
            j = engine.first_boundary(origin, cb, t, self.plan_steps)
            if j < self.plan_steps:
                self.plan_steps = j
                self.version += 1
                self.host.schedule(self, engine.boundary_time(origin, cb, j))
        elif not self.waking:
            self.waking = True
            self.version += 1
            self.host.schedule(self, max(self.now, t))

    def fire(self, now: float) -> None:
        """The scheduled event: apply the planned decode steps, then handle this step boundary:
        completions, arrivals, an admission, and the next plan (one method: it runs for every
        event)."""
        engine = self.engine
        steps = self.plan_steps
        if steps:
            engine.held += steps * len(engine.running)  # `advance`, inlined
            engine.steps += steps
            engine.steps_since_admission += steps
            self.plan_steps = 0
        self.waking = False
        self.now = now
        finishing = engine.finishing
        if finishing and finishing[0][0] <= engine.steps:
            self._finish(now)
        policy, inbox, waiting = self.policy, self.inbox, self.waiting
        while True:
            duration = 0.0
            if inbox:
                if (
                    self.push_pop is not None
                    and not waiting
                    and len(inbox) == 1
                    and (not engine.running or engine.steps_since_admission >= self.admit_every)
                    and engine.fits_one(inbox[0].request)
                ):
                    duration = self._start_alone(inbox.pop(), now)
                else:
                    push = self._push
                    for job in inbox:
                        push(job)
                    inbox.clear()
                self.blocked = False
            if (
                waiting
                and (not engine.running or engine.steps_since_admission >= self.admit_every)
                and (self.dynamic_head or not self.blocked)
            ):
                if self.charges_matter:
                    self._charge_queued(now)
                batch = self._admit(now)
                if batch:
                    duration = self._prefill(batch, now)
                else:
                    self.blocked = True
                    self.blocked_on = policy.peek(now)
            if engine.running:
                break
            if waiting:
                if duration > 0.0:  # all of the prefill finished at once: try again
                    now = self.now = now + duration
                    continue
                head = policy.peek(now)
                if head is not None and policy.remove(head):
                    job = self.jobs.pop(head.seq)
                    left = waiting[head.tenant] - 1
                    if left:
                        waiting[head.tenant] = left
                    else:
                        del waiting[head.tenant]
                    self.queued_tokens -= job.tokens
                    self.host.rejected(job, now)
                self.blocked = False
                continue
            self.now = now + duration
            self.origin_t = self.now
            if self.state is State.DRAINING:
                self._stop(self.now)
            return
        # The plan: sleep through plain decode steps until the next one that matters (module
        # docstring). A plan needs a running batch.
        origin = self.origin_t = now + duration
        steps = engine.finishing[0][0] - engine.steps
        if waiting:
            allowed = self.admit_every - engine.steps_since_admission
            if allowed < 1:
                allowed = 1
            if self.dynamic_head or not self.blocked:
                if allowed < steps:
                    steps = allowed
            elif self.blocked_on is not None and allowed < steps:
                # The refused head may fit at a later step as the batch nears completion.
                fit = engine.first_fit_step(
                    self.blocked_on, engine.steps + allowed, engine.steps + steps - 1
                )
                if fit is not None:
                    steps = fit - engine.steps
                    self.blocked = False  # the next boundary processed tries again
        size = len(engine.running)
        cb = self.plan_cb = self.decode_base_s + self.decode_per_request_s * size
        self.plan_steps = steps
        self.version += 1
        tokens = steps * engine.held + size * (steps * (steps - 1) // 2)
        self.host.schedule(self, origin + (steps * cb + engine.per_context_s * tokens))

    # Lazy charging. A policy reads a tenant's counter only to compare tenants that have queued
    # requests, to lift a tenant joining the queue (the queued tenants' least counter, or the last
    # tenant to leave when the queue is empty) and on completion; so before each of those the
    # pending output tokens of exactly those tenants' running requests are charged, all at once.
    # A tenant already charged at this step (`clean_at`) is skipped by the callers themselves.

    def _charge_tenant(self, tenant: str, now: float, steps: int) -> None:
        """Charge the tenant's running requests up to `steps` (the engine's decode-step count,
        which every caller has at hand)."""
        self.clean_at[tenant] = steps
        group = self.by_tenant.get(tenant)
        if group is None:
            return
        charge = self.policy.charge
        next_step = steps + 1
        for running in group:
            request = running.request
            generated = next_step - running.admit_step
            target = running.target_output_tokens
            if generated > target:
                generated = target
            pending = generated - request.output_tokens
            if pending:
                charge(request, output_tokens=pending, now=now)
                request.output_tokens = generated

    def _charge_queued(self, now: float) -> None:
        steps, clean_at = self.engine.steps, self.clean_at
        for tenant in self.waiting:
            if clean_at.get(tenant) != steps:
                self._charge_tenant(tenant, now, steps)

    def _charge_joining(self, tenant: str) -> None:
        """Before `tenant`, not queued, joins the queue: charge the tenant and what the policy's
        lift may read (the queued tenants, or with none queued the last tenant to leave)."""
        now, steps, clean_at, waiting = self.now, self.engine.steps, self.clean_at, self.waiting
        if waiting:
            self._charge_queued(now)
        if clean_at.get(tenant) != steps:
            self._charge_tenant(tenant, now, steps)
        last = self.last_popped
        if not waiting and last is not None and clean_at.get(last) != steps:
            self._charge_tenant(last, now, steps)

    def _push(self, job: Job) -> None:
        request = job.request
        tenant = request.tenant
        waiting = self.waiting
        if tenant in waiting:
            waiting[tenant] += 1
        else:
            if self.charges_matter:
                self._charge_joining(tenant)
            waiting[tenant] = 1
        self.jobs[request.seq] = job
        self.policy.push(request, request.arrival_s)

    def _start_alone(self, job: Job, now: float) -> float:
        """Start a lone arrival to an empty queue, on an engine free to admit, that `fits_one`
        accepted (the usual case below saturation): what `_push`, `_admit` and `_prefill` would
        do, with the policy's `push_pop` and no queue bookkeeping. Nothing else is queued, so
        the charges before the admission would find every queued tenant charged already."""
        request = job.request
        tenant = request.tenant
        if self.charges_matter:
            self._charge_joining(tenant)
        assert self.push_pop is not None
        self.push_pop(request, now)
        self.last_popped = tenant
        return self._prefill([job], now)

    def _finish(self, now: float) -> None:
        engine = self.engine
        done: list[Job] = engine.finished_running()  # type: ignore[assignment]  # only jobs run
        if self.charges_matter:
            steps, clean_at = engine.steps, self.clean_at
            for running in done:
                tenant = running.request.tenant
                if clean_at.get(tenant) != steps:
                    self._charge_tenant(tenant, now, steps)
        by_tenant, complete, completed = self.by_tenant, self.policy.complete, self.host.completed
        predictor = self.predictor
        for running in done:
            request = running.request
            tenant = request.tenant
            group = by_tenant[tenant]
            if len(group) == 1:
                del by_tenant[tenant]
            else:
                group.remove(running)
            request.output_tokens = running.target_output_tokens
            complete(request, now)
            if predictor is not None:
                predictor.observe(tenant, request.output_tokens)
            completed(running, now)
        self.blocked = False

    def _prefill(self, batch: list[Job], now: float) -> float:
        """Start the admitted (staged) `batch`; returns the prefill's duration."""
        engine = self.engine
        duration = engine.start(now, batch)  # the jobs themselves become the running entries
        by_tenant, clean_at = self.by_tenant, self.clean_at
        tokens = 0
        for job in batch:
            tenant = job.tenant
            group = by_tenant.get(tenant)
            if group is None:
                by_tenant[tenant] = [job]
            else:
                group.append(job)
            clean_at[tenant] = -1
            job.dispatch_index = job.order
            job.dispatch_s = now
            tokens += job.tokens
        self.queued_tokens -= tokens
        if engine.finishing[0][0] <= engine.steps:
            self._finish(now + duration)
        return duration

    def _admit(self, now: float) -> list[Job]:
        """The policy's heads while the staggered check and the prefill cap allow, in order."""
        policy, engine, waiting, jobs = self.policy, self.engine, self.waiting, self.jobs
        peek, pop, fits_one, stage = policy.peek, policy.pop, engine.fits_one, engine.stage
        cap = self.prefill_cap
        batch: list[Job] = []
        prompt = 0
        # `waiting` first: once the last queued request is staged, no final `peek` is needed.
        while waiting and (head := peek(now)) is not None:
            if batch and prompt + head.input_tokens > cap:
                break
            if not fits_one(head):
                break
            popped = pop(now)
            assert popped is head, "a policy must dispatch exactly the head it showed"
            tenant = head.tenant
            left = waiting[tenant] - 1
            if left:
                waiting[tenant] = left
            else:
                del waiting[tenant]
            self.last_popped = tenant
            stage(head)
            batch.append(jobs.pop(head.seq))
            prompt += head.input_tokens
        return batch
