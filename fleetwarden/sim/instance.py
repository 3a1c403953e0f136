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
from dataclasses import dataclass
from enum import IntEnum
from math import ceil, sqrt
from typing import Protocol

from fleetwarden.api.enums import Tier
from fleetwarden.fairness.prediction import MovingAverage
from fleetwarden.fairness.request import Request, SchedulingPolicy
from fleetwarden.sim.engine import EngineProfile
from fleetwarden.sim.fleet_engine import FleetEngine, FleetRunning


@dataclass(eq=False, slots=True)
class Job:
    """One request's journey through the fleet (the simulator's record of it)."""

    request: Request
    model: str
    home: str
    """Region the request came from."""
    tenant: str
    tier: Tier
    """Tier for the results (a promoted NIW item still counts as NIW)."""
    tokens: int
    """Prompt plus output tokens: the work it brings."""
    arrival_s: float
    niw_deadline_s: float | None = None
    """Absolute completion deadline of a NIW item."""
    pool: str = ""
    instance: int = -1
    spilled: bool = False
    dispatch_s: float = math.nan
    dispatch_index: int = -1
    """Admission order on its instance (the order the policy dispatched it)."""
    first_token_s: float = math.nan


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
        "blocked",
        "blocked_on",
        "by_tenant",
        "charges_matter",
        "clean_at",
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
        self.policy = policy
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
        self.by_tenant: dict[str, list[FleetRunning]] = {}
        """Running requests per tenant (lazy charging goes tenant by tenant)."""
        self.clean_at: dict[str, int] = {}
        """Decode-step count at which each tenant's running requests were last charged."""
        self.waiting: dict[str, int] = {}
        """Requests queued in the policy, per tenant."""
        self.last_popped: str | None = None

    # -- what the router and the scaler read -----------------------------------------------------

    @property
    def budget(self) -> int:
        return self.engine.profile.kv_budget_tokens

    def load_tokens(self) -> int:
        """KV tokens committed: the running batch at its final size plus everything queued."""
        return self.engine.committed + self.queued_tokens

    def queued(self) -> int:
        return len(self.inbox) + len(self.policy)

    def idle(self) -> bool:
        return not self.engine.running and not self.inbox and not len(self.policy)

    def held_at(self, t: float) -> int:
        """KV tokens held at the last step boundary at or before `t` (for utilisation)."""
        engine = self.engine
        if not self.plan_steps or t <= self.origin_t:
            return engine.held
        j = self._first_boundary(t, self.plan_steps)
        if self._boundary_time(j) > t:
            j -= 1
        return engine.held + j * len(engine.running)

    def utilisation(self, t: float) -> float:
        return self.held_at(t) / self.budget

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
            self._cut(t)
        elif not self.waking:
            self.waking = True
            self.version += 1
            self.host.schedule(self, max(self.now, t))

    def _boundary_time(self, j: int) -> float:
        """Time of the j-th step boundary of the plan: the engine's step times summed, in closed
        form (step i takes cb + e * (held + i * batch)), so no step is visited one by one."""
        engine = self.engine
        tokens = j * engine.held + len(engine.running) * (j * (j - 1) // 2)
        return self.origin_t + (j * self.plan_cb + engine.per_context_s * tokens)

    def _first_boundary(self, t: float, n_max: int) -> int:
        """The first j in [1, n_max] whose boundary is at or after `t` (n_max if none is)."""
        c = t - self.origin_t
        if c <= 0:
            return 1
        engine = self.engine
        e = engine.per_context_s
        batch, held, cb, origin = len(engine.running), engine.held, self.plan_cb, self.origin_t
        a = e * batch / 2
        b = cb + e * held - a
        root = 2 * c / (b + sqrt(b * b + 4 * a * c))  # the positive root, stably
        j = ceil(root)
        if j > n_max:
            j = n_max
        if j < 1:
            j = 1
        # The same sums as `_boundary_time`, inlined: this runs for every routed request.
        while (
            j > 1
            and origin + ((j - 1) * cb + e * ((j - 1) * held + batch * ((j - 1) * (j - 2) // 2)))
            >= t
        ):
            j -= 1
        while j < n_max and origin + (j * cb + e * (j * held + batch * (j * (j - 1) // 2))) < t:
            j += 1
        return j

    def _cut(self, t: float) -> None:
        """Bring the planned event forward to the first step boundary at or after `t`."""
        j = self._first_boundary(t, self.plan_steps)
        if j < self.plan_steps:
            self.plan_steps = j
            self.version += 1
            self.host.schedule(self, self._boundary_time(j))

    def _plan(self) -> None:
        """Sleep through plain decode steps until the next one that matters (module docstring)."""
        engine = self.engine
        steps = engine.first_finish() - engine.steps  # a plan needs a running batch
        if len(self.policy):
            k = engine.profile.admit_every_decode_steps
            allowed = max(1, k - engine.steps_since_admission)
            if self.dynamic_head or not self.blocked:
                steps = min(steps, allowed)
            elif self.blocked_on is not None and allowed < steps:
                # The refused head may fit at a later step as the batch nears completion.
                fit = engine.first_fit_step(
                    self.blocked_on, engine.steps + allowed, engine.steps + steps - 1
                )
                if fit is not None:
                    steps = fit - engine.steps
                    self.blocked = False  # the next boundary processed tries again
        profile = engine.profile
        batch = len(engine.running)
        cb = self.plan_cb = profile.decode_base_s + profile.decode_per_request_s * batch
        self.plan_steps = steps
        self.version += 1
        tokens = steps * engine.held + batch * (steps * (steps - 1) // 2)
        self.host.schedule(self, self.origin_t + (steps * cb + engine.per_context_s * tokens))

    def fire(self, now: float) -> None:
        """The scheduled event: apply the planned decode steps, then handle this step boundary."""
        steps = self.plan_steps
        if steps:
            engine = self.engine
            engine.held += steps * len(engine.running)  # `advance`, inlined
            engine.steps += steps
            engine.steps_since_admission += steps
            self.plan_steps = 0
        self.waking = False
        self.now = now
        self._boundary()

    # Lazy charging. A policy reads a tenant's counter only to compare tenants that have queued
    # requests, to lift a tenant joining the queue (the queued tenants' least counter, or the last
    # tenant to leave when the queue is empty) and on completion; so before each of those the
    # pending output tokens of exactly those tenants' running requests are charged, all at once.

    def _charge_tenant(self, tenant: str, now: float) -> None:
        steps = self.engine.steps
        clean_at = self.clean_at
        if clean_at.get(tenant) == steps:
            return
        clean_at[tenant] = steps
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
                request.output_tokens += pending

    def _charge_queued(self, now: float) -> None:
        steps, clean_at = self.engine.steps, self.clean_at
        for tenant in self.waiting:
            if clean_at.get(tenant) != steps:
                self._charge_tenant(tenant, now)

    def _push(self, job: Job) -> None:
        request = job.request
        tenant = request.tenant
        waiting = self.waiting
        if tenant not in waiting:
            if self.charges_matter:
                self._charge_queued(self.now)
                self._charge_tenant(tenant, self.now)
                if not waiting and self.last_popped is not None:
                    self._charge_tenant(self.last_popped, self.now)
            waiting[tenant] = 1
        else:
            waiting[tenant] += 1
        self.jobs[request.seq] = job
        self.policy.push(request, request.arrival_s)

    def _left_queue(self, tenant: str) -> None:
        left = self.waiting[tenant] - 1
        if left:
            self.waiting[tenant] = left
        else:
            del self.waiting[tenant]

    def _finish(self, now: float) -> None:
        engine = self.engine
        done = engine.finished_running()
        if self.charges_matter:
            for running in done:
                self._charge_tenant(running.request.tenant, now)
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
            completed(running.tag, now)
        self.blocked = False

    def _boundary(self) -> None:
        engine, policy = self.engine, self.policy
        now = self.now
        if engine.finish_steps() <= engine.steps:
            self._finish(now)
        while True:
            if self.inbox:
                for job in self.inbox:
                    self._push(job)
                self.inbox.clear()
                self.blocked = False
            duration = 0.0
            if len(policy) and engine.may_admit() and (self.dynamic_head or not self.blocked):
                if self.charges_matter:
                    self._charge_queued(now)
                batch = self._admit(now)
                if batch:
                    jobs = [self.jobs.pop(r.seq) for r in batch]
                    targets = [r.max_output_tokens for r in batch]
                    first = engine.admitted
                    duration = engine.prefill_tagged(batch, now, targets, jobs)
                    by_tenant, clean_at = self.by_tenant, self.clean_at
                    for running in engine.fleet_running()[-len(batch) :]:
                        tenant = running.request.tenant
                        group = by_tenant.get(tenant)
                        if group is None:
                            by_tenant[tenant] = [running]
                        else:
                            group.append(running)
                        clean_at[tenant] = -1
                    for index, job in enumerate(jobs, start=first):
                        job.dispatch_index = index
                        job.dispatch_s = now
                        job.first_token_s = now + duration
                        self.queued_tokens -= job.tokens
                    if engine.finish_steps() <= engine.steps:
                        self._finish(now + duration)
                else:
                    self.blocked = True
                    self.blocked_on = policy.peek(now)
            if engine.running:
                self.origin_t = now + duration
                self._plan()
                return
            if len(policy):
                if duration > 0.0:  # all of the prefill finished at once: try again
                    now = self.now = now + duration
                    continue
                head = policy.peek(now)
                if head is not None and policy.remove(head):
                    job = self.jobs.pop(head.seq)
                    self._left_queue(head.tenant)
                    self.queued_tokens -= job.tokens
                    self.host.rejected(job, now)
                self.blocked = False
                continue
            self.now = now + duration
            self.origin_t = self.now
            if self.state is State.DRAINING:
                self._stop(self.now)
            return

    def _admit(self, now: float) -> list[Request]:
        """The policy's heads while the staggered check and the prefill cap allow, in order."""
        policy, engine = self.policy, self.engine
        cap = engine.profile.prefill_cap_tokens
        batch: list[Request] = []
        prompt = 0
        while (head := policy.peek(now)) is not None:
            if batch and prompt + head.input_tokens > cap:
                break
            if not engine.fits_one(head):
                break
            popped = policy.pop(now)
            assert popped is head, "a policy must dispatch exactly the head it showed"
            self._left_queue(head.tenant)
            self.last_popped = head.tenant
            engine.stage(head)
            batch.append(head)
            prompt += head.input_tokens
        return batch
