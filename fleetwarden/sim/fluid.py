"""The fluid fleet simulation: per-step aggregates for multi-day, many-region runs.

The request-level simulator (`fleetwarden.sim.cluster`) makes every request an event; a week of
a large fleet is tens of millions of them. The fluid mode keeps the same fleet, lifecycle and
decisions, but moves tokens instead of requests, one step (60 s by default) at a time:

- arrivals: tokens/s per (served model, region) and tier from a `RateModel`
  (`fleetwarden.sim.fluid_rates`: the built-in workload's rate model, or binned requests), split
  over a region's pools as the request-level simulator splits them (`pool_shares`);
- service: each endpoint's ready instances serve `throughput` tokens/s each (the ModelDeployment's
  figure; an instance that becomes ready mid-step counts for the rest of the step). Work waits in
  FIFO queues of (arrival time, tokens) per tier, served IW-F, then IW-N (with promoted NIW),
  then released NIW. Interactive work left over spills to other regions' spare capacity when
  `scaling.epsilon` < 1, as the router spills requests. Served tokens go into the simulated
  Prometheus series (`LoadRecorder`) under the serving endpoint, as the request-level run
  records completions: interactive ones (promoted NIW included) as what the sidecars count, NIW
  items as the batch service counts them;
- utilisation: load over capacity mapped to KV utilisation by `ServiceModel`
  (`fleetwarden.sim.fluid_service`, derived from the same engine profile the request-level
  instances run), 1.0 while work is queued;
- TTFT: time queued (FIFO, at step granularity) plus `ServiceModel.ttft_s`'s queueing
  approximation; end-to-end adds the decode time of a mean output;
- decisions: every endpoint's `Scaler.decide` each metrics poll (`METRICS_POLL_INTERVAL_S`, as
  the operator; the cooldown is the scaler's own) on the last step's utilisation, the
  plan's target, the observed tokens/s and the plan's forecast; the `HourlyPlanner` at every
  period start with the recorded series (and the workload's past before time 0,
  `fleetwarden.sim.warmup`); NIW items wait per (model, region) and `ReleaseRule`
  releases them each signal interval (0, 1 or 2 items of mean size per signal, at most
  `niw_max_in_flight` items unserved), promoting those past its age to interactive priority;
- lifecycle: the same `Endpoint` objects as the request-level run: launches ready after the
  pool's model load time (spot reclaims after `spot_reclaim_s`), scale-in cancels a loading
  instance or drains a ready one (at once: its in-flight work is part of the aggregate), donation
  to spot only with `--spot-donation` (SageServe's, not the operator's), and the same
  instance-hour, GPU-hour, cost and cold-start accounting.

What it does not have: tenants (no per-tenant service, Jain's index or throttling), per-pod
policies, per-request spread within a step. Results are `SimResults` with `meta.fidelity`
"fluid"; request counts are tokens over the mean request size, rounded.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from typing import Any

from fleetwarden.api.enums import Tier
from fleetwarden.scaling.config import METRICS_POLL_INTERVAL_S
from fleetwarden.scaling.niw_release import ReleaseRule
from fleetwarden.sim.cluster import SimOptions
from fleetwarden.sim.endpoint import Endpoint
from fleetwarden.sim.fleet_profiles import saturation_tps
from fleetwarden.sim.fleet_spec import Fleet, Model
from fleetwarden.sim.fluid_rates import RateModel
from fleetwarden.sim.fluid_service import ServiceModel
from fleetwarden.sim.fluid_summary import collect_fluid
from fleetwarden.sim.instance import Instance, Job, State
from fleetwarden.sim.plan_inputs import plan_histories, round_models
from fleetwarden.sim.planning import EndpointKey, HourlyPlanner, LastHourPeakPlanner, LoadRecorder
from fleetwarden.sim.planning import pool_shares as split_shares
from fleetwarden.sim.results import NiwStats, SimResults
from fleetwarden.sim.scaling_tick import build_endpoint, scaling_tick
from fleetwarden.sim.warmup import rates_prior

Chunk = list[Any]
"""[arrival time, tokens left, deadline or None]: work that arrived in one step."""
TIERS = (Tier.IW_FAST, Tier.IW_NORMAL, Tier.NIW)


class _Lane:
    """One endpoint's fluid state: queues per tier and the last step's figures."""

    __slots__ = ("endpoint", "queues", "rho", "service", "totals", "utilisation")

    def __init__(self, endpoint: Endpoint, service: ServiceModel) -> None:
        self.endpoint = endpoint
        self.service = service
        self.queues: tuple[deque[Chunk], deque[Chunk], deque[Chunk]] = (deque(), deque(), deque())
        self.totals = [0.0, 0.0, 0.0]
        """Tokens queued per tier, kept with the queues (read on every tick)."""
        self.utilisation: float | None = None
        self.rho = 0.0

    def push(self, index: int, chunk: Chunk) -> None:
        self.queues[index].append(chunk)
        self.totals[index] += chunk[1]

    def queued(self, upto: int = 3) -> float:
        total = 0.0
        for index in range(upto):
            if self.queues[index]:
                total += self.totals[index]
            else:
                self.totals[index] = 0.0  # drop rounding residue when a queue empties
        return total


class FluidSimulation:
    """One fluid run (module docstring). Instances report to it as to the request-level host."""

    def __init__(
        self, fleet: Fleet, rates: RateModel, options: SimOptions, step_s: float = 60.0
    ) -> None:
        if step_s <= 0:
            raise ValueError("step_s must be > 0")
        self.fleet, self.rates, self.options, self.step_s = fleet, rates, options, step_s
        self.planner: HourlyPlanner = options.planner or LastHourPeakPlanner()
        self.lanes: dict[EndpointKey, _Lane] = {}
        self.by_region: dict[tuple[str, str], list[_Lane]] = {}
        self.by_pool: dict[str, list[Endpoint]] = {}
        self.shares: dict[str, dict[str, dict[str, float]]] = {}
        self.niw: dict[tuple[str, str], deque[Chunk]] = {}
        self.rules: dict[str, ReleaseRule] = {}
        self.load = LoadRecorder(step_s)
        self.prior = rates_prior(rates, fleet, step_s)
        """The days before time 0 the planner reads (`fleetwarden.sim.warmup`), or None."""
        self.samples: dict[str, list[Any]] = {}
        self.plans: dict[str, list[Any]] = {}
        self.events: list[list[Any]] = []
        self._iids = itertools.count()
        self._ready: list[tuple[float, int, Instance]] = []
        self._ticks: list[tuple[float, int, EndpointKey]] = []
        self._arrived = {t: 0.0 for t in TIERS}
        self._served = {t: 0.0 for t in TIERS}
        self._within = {t: 0.0 for t in TIERS}
        self._ttft: dict[Tier, tuple[list[float], list[float]]] = {t: ([], []) for t in TIERS}
        self._e2e: dict[Tier, tuple[list[float], list[float]]] = {t: ([], []) for t in TIERS}
        self.niw_stats = NiwStats()
        self._niw_counts = [0.0, 0.0, 0.0, 0.0]  # items, completed, met, promoted
        self.spilled = 0.0
        for model in fleet.models.values():
            self._add_model(model)

    def _add_model(self, model: Model) -> None:
        options = self.options
        self.shares[model.key] = split_shares(model)
        niw = model.spec.niw
        self.rules[model.key] = ReleaseRule(
            niw.release_at[0], niw.release_at[1], float(niw.promote_after_seconds)
        )
        lengths = self.rates.lengths(model.served_name)
        for placement in model.placements:
            key = (model.key, placement.pool)
            pool = self.fleet.pools[placement.pool]
            endpoint = build_endpoint(
                model, placement, pool, options, dynamic_head=False, charges_matter=False
            )
            profile = endpoint.profile
            service = ServiceModel(
                saturation_tps(placement, options.theta_load),
                profile,
                lengths.input_tokens,
                lengths.output_tokens,
            )
            lane = self.lanes[key] = _Lane(endpoint, service)
            self.by_region.setdefault((model.key, placement.region), []).append(lane)
            self.by_pool.setdefault(placement.pool, []).append(endpoint)
        for region in model.regions:
            self.niw[model.key, region] = deque()

    # -- what instances report (the request-level `Host` protocol) --------------------------------

    def schedule(self, instance: Instance, at: float) -> None:
        """Fluid instances hold no requests: nothing to schedule."""

    def completed(self, job: Job, now: float) -> None:
        """Never called: fluid instances hold no requests."""

    def rejected(self, job: Job, now: float) -> None:
        """Never called: fluid instances hold no requests."""

    def stopped(self, instance: Instance, now: float) -> None:
        self.lanes[instance.endpoint].endpoint.stopped(instance, now)

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> SimResults:
        options, step = self.options, self.step_s
        end = options.duration_s
        for key, lane in self.lanes.items():
            endpoint = lane.endpoint
            count = (options.initial_instances or {}).get(key, endpoint.placement.min_instances)
            for _ in range(count):
                self._launch(endpoint, 0.0, warm=True)
            if endpoint.scaler is not None:
                heapq.heappush(self._ticks, (METRICS_POLL_INTERVAL_S, len(self._ticks), key))
        next_plan = 0.0
        steps = math.ceil(end / step)
        for index in range(steps):
            t0 = index * step
            t1 = min(end, t0 + step)
            self._start_ready(t0)
            if t0 >= next_plan:
                self._plan(t0)
                next_plan += options.period_s
            while self._ticks and self._ticks[0][0] < t1:
                at, order, key = heapq.heappop(self._ticks)
                self._start_ready(at)
                cooldown = self._scale(self.lanes[key], at)
                heapq.heappush(self._ticks, (at + cooldown, order, key))
            self._step(t0, t1)
            if options.progress is not None:
                options.progress(t1, end)
        return collect_fluid(self, end)

    def _launch(self, endpoint: Endpoint, t: float, *, warm: bool = False) -> Instance:
        instance = endpoint.launch(
            next(self._iids), self, t, warm=warm, spot_reclaim_s=self.options.spot_reclaim_s
        )
        if not warm:
            heapq.heappush(self._ready, (instance.ready_s, instance.iid, instance))
        return instance

    def _start_ready(self, t: float) -> None:
        ready = self._ready
        while ready and ready[0][0] <= t:
            at, _, instance = heapq.heappop(ready)
            if instance.state is State.LOADING:
                self.lanes[instance.endpoint].endpoint.started(instance, at)

    def _plan(self, t: float) -> None:
        endpoints = {key: lane.endpoint for key, lane in self.lanes.items()}
        history = plan_histories(self.load, self.prior, endpoints, t)
        current = {key: endpoint.current() for key, endpoint in endpoints.items()}
        plans = self.planner.plan(t, self.fleet, history, current)
        models = round_models(self.planner, t, plans)
        for key, entry in plans.items():
            endpoint = endpoints[key]
            endpoint.target, endpoint.forecast_tps = entry.target, entry.forecast_tps
            self.plans.setdefault(f"{key[0]}/{key[1]}", []).append(
                [t, entry.target, entry.forecast_tps, models[key]]
            )

    def _scale(self, lane: _Lane, t: float) -> float:
        """One scaler tick, as `FleetSimulation._scale`; returns the seconds to the next (one
        metrics poll). An endpoint with no serving instance has no reading, as in the operator:
        at 0 instances the scaler's zero guard steps toward a plan above 0."""
        endpoint = lane.endpoint
        utilisation = lane.utilisation if endpoint.serving else None
        return scaling_tick(
            endpoint,
            t,
            utilisation,
            self.load.observed_tps(endpoint.key, t, self.options.observed_window_s),
            self.by_pool[endpoint.pool.name],
            self._launch,
            self.events,
        )

    # -- one step of fluid service ---------------------------------------------------------------

    def _step(self, t0: float, t1: float) -> None:
        dt, mid = t1 - t0, (t0 + t1) / 2
        for (served, region), rate in self.rates.rates(t0, t1).items():
            model = self.fleet.model(served)
            if (model.key, region) not in self.niw:
                continue
            mean = self.rates.lengths(model.served_name).total
            for pool, share in self.shares[model.key][region].items():
                lane = self.lanes[model.key, pool]
                fast, normal = rate.iw_fast * dt * share, rate.iw_normal * dt * share
                for tier, tokens in ((Tier.IW_FAST, fast), (Tier.IW_NORMAL, normal)):
                    if tokens > 0:
                        lane.push(TIERS.index(tier), [mid, tokens, None, tier])
                        self._arrived[tier] += tokens / mean
            niw_tokens = rate.niw * dt
            if niw_tokens > 0:
                deadline = mid + float(model.spec.niw.deadline_seconds)
                self.niw[model.key, region].append([mid, niw_tokens, deadline, Tier.NIW])
                self._arrived[Tier.NIW] += niw_tokens / mean
                self._niw_counts[0] += niw_tokens / mean
        for where in self.niw:
            self._release(where, t0, dt)
        capacity = {key: self._capacity(lane, t0, t1) for key, lane in self.lanes.items()}
        spare = dict(capacity)
        for lane in self.lanes.values():
            key = lane.endpoint.key
            spare[key] = self._serve(lane, lane, spare[key], t0, t1, capacity[key])
        for lane in self.lanes.values():
            model = lane.endpoint.model
            if model.spec.scaling.epsilon >= 1.0 or not lane.queued(2):
                continue
            home = lane.endpoint.placement.region
            for other in self.lanes.values():
                key = other.endpoint.key
                abroad = other.endpoint.placement.region != home
                if other.endpoint.model is model and abroad and spare[key] > 0:
                    spare[key] = self._serve(
                        lane, other, spare[key], t0, t1, capacity[key], spill=True
                    )
        for key, lane in self.lanes.items():
            cap = capacity[key]
            if cap <= 0:
                lane.utilisation, lane.rho = None, 0.0
            else:
                lane.rho = min(1.0, (cap - spare[key]) / cap)
                busy = lane.queued() > 0
                lane.utilisation = 1.0 if busy else lane.service.kv_utilisation(lane.rho)
            self._sample(lane, t0, t1)

    def _capacity(self, lane: _Lane, t0: float, t1: float) -> float:
        """Tokens the ready instances can serve in [t0, t1) (late starters for their part)."""
        seconds = sum(t1 - max(t0, i.now) for i in lane.endpoint.serving)
        return seconds * lane.service.throughput_tps

    def _release(self, where: tuple[str, str], t0: float, dt: float) -> None:
        """NIW release for one (model, region) over a step: `ReleaseRule` per signal."""
        queue = self.niw[where]
        lanes = [lane for lane in self.by_region[where] if lane.endpoint.serving]
        if not queue or not lanes:
            return
        model = lanes[0].endpoint.model
        rule, mean = self.rules[model.key], self.rates.lengths(model.served_name).total
        shares = self.shares[model.key][where[1]]
        known = [lane.utilisation for lane in lanes if lane.utilisation is not None]
        utilisation = sum(known) / len(known) if known else None
        released: list[tuple[Chunk, int]] = []
        while queue and rule.promoted(
            t0 - queue[0][0], math.inf if queue[0][2] is None else queue[0][2] - queue[0][0]
        ):
            chunk = queue.popleft()
            self._niw_counts[3] += chunk[1] / mean
            released.append((chunk, 1))
        signals = dt / self.options.niw_signal_interval_s
        in_flight = sum(lane.queued(3) - lane.queued(2) for lane in lanes)
        room = self.options.niw_max_in_flight * mean - in_flight
        budget = min(rule.release_count(utilisation) * signals * mean, max(0.0, room))
        while queue and budget > 0:
            chunk = queue[0]
            take = min(budget, chunk[1])
            budget -= take
            chunk[1] -= take
            released.append(([chunk[0], take, chunk[2], Tier.NIW], 2))
            if chunk[1] <= 1e-9:
                queue.popleft()
        for chunk, lane_index in released:
            for lane in lanes:
                share = shares.get(lane.endpoint.placement.pool, 0.0)
                total = sum(shares.get(x.endpoint.placement.pool, 0.0) for x in lanes)
                part = chunk[1] * (share / total if total else 1 / len(lanes))
                lane.push(lane_index, [chunk[0], part, chunk[2], Tier.NIW])

    def _serve(
        self,
        lane: _Lane,
        server: _Lane,
        tokens: float,
        t0: float,
        t1: float,
        capacity: float,
        *,
        spill: bool = False,
    ) -> float:
        """Serve `lane`'s queues FIFO by priority on `server`'s `tokens` (of `capacity` this
        step); returns what is left. A chunk's first tokens come when the server reaches it:
        after what it served earlier this step, at its capacity rate (its FIFO position), so a
        saturated step's wait is the queue ahead, not a steady-state factor."""
        service = server.service
        targets = lane.endpoint.model.fairness.tiers
        mean = service.input_tokens + service.output_tokens
        rho = min(1.0, server.rho)
        base = service.ttft_s(rho, 0.0, 1.0)
        decode = service.e2e_s(rho, 0.0)
        rate = capacity / (t1 - t0) if capacity > 0 else 0.0
        totals, add, key = lane.totals, self.load.add, server.endpoint.key
        for index, queue in enumerate(lane.queues):
            if spill and index == 2:
                break
            while queue and tokens > 0:
                chunk = queue[0]
                take = min(tokens, chunk[1])
                tokens -= take
                chunk[1] -= take
                totals[index] -= take
                if chunk[1] <= 1e-9:
                    queue.popleft()
                tier: Tier = chunk[3]
                # The planner's series, as the request-level run records completions: served
                # tokens under the serving endpoint; NIW items (promoted ones too: iw-n) as NIW.
                if index < 2:
                    add(key, t0, take, niw=False)
                if chunk[2] is not None:
                    add(key, t0, take, niw=True)
                count = take / mean
                reached = t0 + (capacity - tokens - take) / rate if rate > 0 else t0
                ttft = max(0.0, reached - chunk[0]) + base
                self._served[tier] += count
                values, weights = self._ttft[tier]
                values.append(ttft)
                weights.append(count)
                values, weights = self._e2e[tier]
                values.append(ttft + decode)
                weights.append(count)
                target = targets.get(tier)
                if target is not None and ttft <= target.ttft_s:
                    self._within[tier] += count
                if spill:
                    self.spilled += count
                if chunk[2] is not None:
                    self._niw_counts[1] += count
                    if t1 <= chunk[2]:
                        self._niw_counts[2] += count
        return tokens

    def _sample(self, lane: _Lane, t0: float, t1: float) -> None:
        endpoint = lane.endpoint
        states = [i.state for i in endpoint.instances]
        key = endpoint.key
        self.samples.setdefault(f"{key[0]}/{key[1]}", []).append(
            [
                t0,
                states.count(State.READY),
                states.count(State.LOADING),
                states.count(State.DRAINING),
                lane.utilisation,
                endpoint.target,
                endpoint.donated,
                self.load.observed_tps(key, t1, self.step_s),
            ]
        )


def simulate_fluid(
    fleet: Fleet, rates: RateModel, options: SimOptions, step_s: float = 60.0
) -> SimResults:
    """Run one fluid simulation (module docstring) and return its results."""
    return FluidSimulation(fleet, rates, options, step_s).run()
