"""The request-level fleet simulation: regions of instances, routing, scaling, NIW release.

Every request is an event; every instance is a continuous-batching engine model driven event by
event (`fleetwarden.sim.instance`). Around them, the decisions production makes, made by the same
pure objects:

- routing (SageServe 6.1): least-loaded ready instance of the request's region, spilling to
  other regions when it has no room and the ModelDeployment allows it (`fleetwarden.sim.routing`);
- per-pod scheduling: each instance runs `build_policy` of the TenantPolicy's rendered config,
  and the pod's rate limits or OIT (`fleetwarden.sim.throttle`);
- scaling: at every 15 s metrics poll, as the operator, `Scaler.decide` (`sim.scaling_tick`) on
  the endpoint's KV utilisation, the plan's target, the observed tokens/s (last 5 minutes) and
  the plan's forecast; +1 and -1 are applied as `fleetwarden.sim.endpoint` describes;
- planning: at every period start, an `HourlyPlanner` on the recorded tokens/s series;
- NIW: items queue centrally and are released by `ReleaseRule` (`fleetwarden.sim.niw_queue`).

Events at the same time run in a fixed order (control, ticks, arrivals, instance steps) with a
sequence number as the last tie-breaker, so a run is a pure function of its inputs: no wall
clock, no unseeded randomness.

Usage::

    fleet = load_fleet(Path("examples"))                       # fleetwarden.sim.fleet_spec
    workload = BuiltinWorkload(duration_s=86400, seed=1).build(fleet)
    results = simulate(fleet, workload, SimOptions(duration_s=86400, strategy=ScalingStrategy.LT_UA))
    Path("summary.json").write_text(results.to_json())
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fleetwarden.api.enums import Ordering, PolicyName, ScalingStrategy, Tier
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.scaling.config import METRICS_POLL_INTERVAL_S
from fleetwarden.scaling.niw_release import ReleaseRule
from fleetwarden.sim.endpoint import Endpoint
from fleetwarden.sim.engine import EngineProfile
from fleetwarden.sim.fleet_profiles import (
    DEFAULT_KV_BUDGET_TOKENS,
    DEFAULT_THETA_LOAD,
)
from fleetwarden.sim.fleet_spec import Fleet, Model
from fleetwarden.sim.instance import Instance, Job, State
from fleetwarden.sim.niw_queue import NiwQueue
from fleetwarden.sim.plan_inputs import plan_histories, round_models, workload_prior
from fleetwarden.sim.planning import (
    EndpointKey,
    HourlyPlanner,
    LastHourPeakPlanner,
    LoadRecorder,
    pool_shares,
)
from fleetwarden.sim.results import Recorder, SimResults
from fleetwarden.sim.routing import least_loaded, released_request, route, scheduler_request
from fleetwarden.sim.scaling_tick import build_endpoint, scaling_tick
from fleetwarden.sim.summary import collect
from fleetwarden.sim.throttle import PodThrottle, has_limits
from fleetwarden.sim.workload import SimRequest, WorkloadError

PRIO_CONTROL, PRIO_TICK, PRIO_ARRIVAL, PRIO_STEP = 0, 1, 2, 3
COUNTER_POLICIES = (PolicyName.VTC, PolicyName.LCF, PolicyName.WSC)


@dataclass(frozen=True, slots=True)
class _Origin:
    model: Model
    key: str
    """`model.key` (a property that formats a string each time it is read)."""
    config: FairnessConfig
    shares: tuple[tuple[EndpointKey, float], ...]
    longest: int
    """Most prompt plus output tokens a request may have (KV budget, max-model-len)."""
    niw_queue: NiwQueue
    niw_deadline_s: float


class SimulationError(ValueError):
    """The simulation cannot run: a request names a model or region the fleet lacks."""


@dataclass(frozen=True)
class SimOptions:
    """How to run; everything else comes from the fleet's custom resources."""

    duration_s: float = 86_400.0
    strategy: ScalingStrategy | None = None
    """Override every ModelDeployment's `scaling.strategy` (None: each its own)."""
    scaling: bool = True
    """False pins every endpoint at its initial instances (static capacity)."""
    planner: HourlyPlanner | None = None
    """None: `LastHourPeakPlanner`."""
    period_s: float = 3600.0
    """Seconds between plans and the scalers' period; `run.options_for` sets the operator's."""
    spot_donation: bool = False
    """SageServe's spot donation, not implemented by the operator (`sim.spot_donation`)."""
    spot_reclaim_s: float = 60.0
    niw_signal_interval_s: float = 1.0
    niw_max_in_flight: int = 32
    sample_interval_s: float = 60.0
    tenant_period_s: float = 3600.0
    observed_window_s: float = 300.0
    initial_instances: Mapping[EndpointKey, int] | None = None
    """Ready instances at time 0 (default: each region's minInstances)."""
    profiles: Mapping[EndpointKey, EngineProfile] | None = None
    kv_budget_tokens: int = DEFAULT_KV_BUDGET_TOKENS
    theta_load: float = DEFAULT_THETA_LOAD
    """Share of an instance's saturated throughput its declared tokens/s stands for
    (`fleet_profiles`: 1.0 = the declared figure is the saturated throughput)."""
    exact_dynamic_heads: bool = True
    """Re-check a counter policy's (or DPA's) head at every allowed step while blocked, as the
    replay loop does; False checks only after completions and arrivals (faster, approximate)."""
    seed: int = 0
    """Recorded in the results; the simulation itself draws no random numbers."""
    keep_requests: bool = False
    """Keep one `RequestOutcome` per request in the results (tests, debugging)."""
    progress: Callable[[float, float], None] | None = None
    """Called with (simulated time, end time) at every sample: for a progress bar."""


class FleetSimulation:
    """One run over one workload (see the module docstring)."""

    def __init__(self, fleet: Fleet, workload: Iterable[SimRequest], options: SimOptions) -> None:
        self.fleet, self.workload, self.options = fleet, workload, options
        self.planner: HourlyPlanner = options.planner or LastHourPeakPlanner()
        self.endpoints: dict[EndpointKey, Endpoint] = {}
        self.by_region: dict[tuple[str, str], list[Endpoint]] = {}
        self.by_pool: dict[str, list[Endpoint]] = {}
        self.niw: dict[tuple[str, str], NiwQueue] = {}
        self.pending: dict[tuple[str, str], list[Job]] = {}
        self.shares: dict[str, dict[str, dict[str, float]]] = {}
        self.throttles: dict[int, PodThrottle] = {}
        self.instances: dict[int, Instance] = {}
        self._models: dict[str, Model] = {}
        self._origins: dict[tuple[str, str], _Origin] = {}
        self._heap: list[tuple[float, int, int, int, Any, int]] = []
        self._counter = itertools.count()
        self._iids = itertools.count()
        self._seqs = itertools.count()
        self._interactions: set[tuple[str, str, str]] = set()
        self._broken: set[tuple[str, str, str]] = set()
        self.now = 0.0
        self.recorder = Recorder(
            {
                m.key: {t: c.ttft_s for t, c in m.fairness.tiers.items()}
                for m in fleet.models.values()
            },
            options.tenant_period_s,
            keep_requests=options.keep_requests,
            tbt_targets={
                m.key: {t: c.tbt_s for t, c in m.fairness.tiers.items()}
                for m in fleet.models.values()
            },
        )
        self.load = LoadRecorder(min(60.0, options.sample_interval_s))
        self.samples: dict[str, list[Any]] = {}
        self.events: list[list[Any]] = []
        """Scaling events: time, endpoint, step, reason, instance id, ready time."""
        self.plans: dict[str, list[Any]] = {}
        for model in fleet.models.values():
            self._add_model(model)

    def _add_model(self, model: Model) -> None:
        config = model.fairness
        counters = config.policy in COUNTER_POLICIES
        dynamic = config.ordering is Ordering.DPA or (counters and self.options.exact_dynamic_heads)
        self.shares[model.key] = pool_shares(model)
        niw = model.spec.niw
        rule = ReleaseRule(niw.release_at[0], niw.release_at[1], float(niw.promote_after_seconds))
        for placement in model.placements:
            pool = self.fleet.pools[placement.pool]
            endpoint = build_endpoint(
                model, placement, pool, self.options, dynamic_head=dynamic, charges_matter=counters
            )
            self.endpoints[model.key, placement.pool] = endpoint
            self.by_region.setdefault((model.key, placement.region), []).append(endpoint)
            self.by_pool.setdefault(placement.pool, []).append(endpoint)
        for region in model.regions:
            self.niw[model.key, region] = NiwQueue(rule, self.options.niw_max_in_flight)
            self.pending[model.key, region] = []

    # -- the event loop --------------------------------------------------------------------------

    def _push(self, at: float, prio: int, kind: str, obj: Any, version: int = 0) -> None:
        heapq.heappush(self._heap, (at, prio, next(self._counter), _KINDS[kind], obj, version))

    def schedule(self, instance: Instance, at: float) -> None:
        heapq.heappush(
            self._heap, (at, PRIO_STEP, next(self._counter), 0, instance, instance.version)
        )

    def run(self) -> SimResults:
        options = self.options
        end = options.duration_s
        for key, endpoint in self.endpoints.items():
            count = (options.initial_instances or {}).get(key, endpoint.placement.min_instances)
            for _ in range(count):
                self._launch(endpoint, 0.0, warm=True)
            if endpoint.scaler is not None:
                self._push(METRICS_POLL_INTERVAL_S, PRIO_TICK, "scale", endpoint)
        self._push(0.0, PRIO_CONTROL, "plan", None)
        self._push(0.0, PRIO_TICK, "sample", None)
        arrivals: Iterator[SimRequest] = iter(self.workload)
        upcoming = next(arrivals, None)
        heap, heappop, stopped, arrive = self._heap, heapq.heappop, State.STOPPED, self._arrive
        last = -1.0
        while True:
            t_arrival = upcoming.arrival_s if upcoming is not None else math.inf
            # Every event before the next arrival (the arrival only moves when it is handled).
            while heap and (
                heap[0][0] < t_arrival or (heap[0][0] == t_arrival and heap[0][1] < PRIO_ARRIVAL)
            ):
                at, _, _, kind, obj, version = heappop(heap)
                if at >= end:
                    break
                self.now = at
                if kind == 0:
                    if version == obj.version and obj.state is not stopped:
                        obj.fire(at)
                else:
                    _HANDLERS[kind](self, obj, at)
            else:
                if upcoming is not None and t_arrival < end:
                    if t_arrival < last:
                        raise WorkloadError(f"requests out of order at {t_arrival} (after {last})")
                    last = self.now = t_arrival
                    arrive(upcoming)
                    upcoming = next(arrivals, None)
                    continue
            break
        self.now = end
        self._sample(None, end)  # the state at the end, for the series
        return collect(self, end)

    # -- requests --------------------------------------------------------------------------------

    def model(self, name: str) -> Model:
        model = self._models.get(name)
        if model is None:
            try:
                model = self._models[name] = self.fleet.model(name)
            except KeyError as exc:
                raise SimulationError(str(exc.args[0])) from exc
        return model

    def _origin(self, model_name: str, region: str) -> _Origin:
        """What every request of one model from one region shares, looked up once."""
        model = self.model(model_name)
        if (model.key, region) not in self.niw:
            raise SimulationError(
                f"a request for {model.served_name} comes from region {region!r}, which "
                f"{model.key} does not serve (its regions: {list(model.regions)})"
            )
        endpoints = self.by_region[model.key, region]
        budget = min(e.profile.kv_budget_tokens for e in endpoints)
        if model.max_model_len is not None:
            budget = min(budget, model.max_model_len)
        origin = _Origin(
            model=model,
            key=model.key,
            config=model.fairness,
            shares=tuple(((model.key, p), s) for p, s in self.shares[model.key][region].items()),
            longest=budget,
            niw_queue=self.niw[model.key, region],
            niw_deadline_s=float(model.spec.niw.deadline_seconds),
        )
        self._origins[model_name, region] = origin
        return origin

    def _arrive(self, item: SimRequest) -> None:
        origin = self._origins.get((item.model, item.region)) or self._origin(
            item.model, item.region
        )
        config = origin.config
        tenant = item.tenant
        tier = item.tier or config.tenants.get(tenant, config.defaults).tier
        niw = tier is Tier.NIW
        tokens = item.input_tokens + item.output_tokens
        t = item.arrival_s
        deadline = t + (item.deadline_s or origin.niw_deadline_s) if niw else None
        model_key = origin.key
        job = Job(
            scheduler_request(item, config, tier, t, next(self._seqs)),
            model_key,
            item.region,
            tenant,
            tier,
            tokens,
            t,
            deadline,
        )
        self.recorder.arrived(job)
        if tokens > origin.longest:  # longer than the KV budget or the engine's max-model-len
            self.recorder.rejected(job)
            return
        if niw:
            queue = origin.niw_queue
            queue.push(job)
            if not queue.signalling:
                queue.signalling = True
                self._push(t, PRIO_TICK, "niw", (model_key, item.region))
            return
        interaction = (model_key, tenant, item.interaction) if item.interaction else None
        if interaction is not None:
            if interaction in self._broken:
                self.recorder.abandoned += 1
                return
            job.request.continuation = interaction in self._interactions
        self._dispatch(job, t, interaction)

    def _dispatch(self, job: Job, t: float, key: tuple[str, str, str] | None = None) -> None:
        instance = route(job, self.fleet.models[job.model], self.by_region)
        if instance is None:
            self.pending[job.model, job.home].append(job)
            return
        throttle = self.throttles.get(instance.iid)
        if throttle is not None and throttle.refuse(job.request, t, instance):
            self.recorder.throttled(job)
            if key is not None:
                self._broken.add(key)
            return
        if key is not None:
            self._interactions.add(key)
        job.pool = instance.endpoint[1]
        job.instance = instance.iid
        instance.enqueue(job, t)

    # -- what instances report -------------------------------------------------------------------

    def completed(self, job: Job, now: float) -> None:
        self.recorder.completed(job, now)
        # The planner's series: tokens served, counted at completion under the serving endpoint
        # as the sidecars count them (NIW: the batch service's count; promoted items are iw-n).
        served, niw = (job.model, job.pool), job.niw_deadline_s is not None
        if not niw or job.request.tier is not Tier.NIW:
            self.load.add(served, now, job.tokens, niw=False)
        throttle = self.throttles.get(job.instance)
        if throttle is not None:
            throttle.output_tokens(job.request, job.request.max_output_tokens, now)
        if niw:
            self.niw[job.model, job.home].in_flight -= 1
            self.load.add(served, now, job.tokens, niw=True)

    def rejected(self, job: Job, now: float) -> None:
        self.recorder.rejected(job)
        if job.niw_deadline_s is not None:
            self.niw[job.model, job.home].in_flight -= 1

    def stopped(self, instance: Instance, now: float) -> None:
        self.endpoints[instance.endpoint].stopped(instance, now)
        self.instances.pop(instance.iid, None)
        self.throttles.pop(instance.iid, None)

    # -- control events --------------------------------------------------------------------------

    def _launch(self, endpoint: Endpoint, t: float, *, warm: bool = False) -> Instance:
        instance = endpoint.launch(
            next(self._iids), self, t, warm=warm, spot_reclaim_s=self.options.spot_reclaim_s
        )
        self.instances[instance.iid] = instance
        if has_limits(endpoint.model.fairness):
            self.throttles[instance.iid] = PodThrottle(endpoint.model.fairness)
        if not warm:
            self._push(instance.ready_s, PRIO_CONTROL, "ready", instance)
        return instance

    def _ready(self, instance: Instance, t: float) -> None:
        if instance.state is not State.LOADING:
            return
        self.endpoints[instance.endpoint].started(instance, t)
        model = self.fleet.models[instance.endpoint[0]]
        home = model.placement(instance.endpoint[1]).region
        regions = model.regions if model.spec.scaling.epsilon < 1.0 else (home,)
        for region in regions:
            waiting, self.pending[model.key, region] = self.pending[model.key, region], []
            for job in waiting:
                self._dispatch(job, t)

    def _scale(self, endpoint: Endpoint, t: float) -> None:
        # No ready instance, no reading (as in Prometheus): the scaler holds, or leaves 0.
        next_s = scaling_tick(
            endpoint,
            t,
            endpoint.utilisation(t),
            self.load.observed_tps(endpoint.key, t, self.options.observed_window_s),
            self.by_pool[endpoint.pool.name],
            self._launch,
            self.events,
        )
        self._push(t + next_s, PRIO_TICK, "scale", endpoint)

    def _plan(self, _: Any, t: float) -> None:
        prior = workload_prior(self.workload, self.load.bucket_s)  # the days before 0 (warm-up)
        history = plan_histories(self.load, prior, self.endpoints, t)
        current = {key: e.current() for key, e in self.endpoints.items()}
        plans = self.planner.plan(t, self.fleet, history, current)
        models = round_models(self.planner, t, plans)
        for key, entry in plans.items():
            endpoint = self.endpoints[key]
            endpoint.target = entry.target
            endpoint.forecast_tps = entry.forecast_tps
            self.plans.setdefault(f"{key[0]}/{key[1]}", []).append(
                [t, entry.target, entry.forecast_tps, models[key]]
            )
        self._push(t + self.options.period_s, PRIO_CONTROL, "plan", None)

    def _niw_signal(self, where: tuple[str, str], t: float) -> None:
        queue = self.niw[where]
        ready = [i for e in self.by_region[where] for i in e.serving]
        utilisation = sum([i.utilisation(t) for i in ready]) / len(ready) if ready else None
        released = queue.release(t, utilisation) if ready else []
        for job, promoted in released:
            tier = Tier.IW_NORMAL if promoted else Tier.NIW
            config = self.fleet.models[job.model].fairness
            job.request = released_request(job.request, config, tier, t)
            if promoted:
                self.recorder.niw.promoted += 1
            instance = least_loaded(self.by_region[where])
            assert instance is not None
            job.pool, job.instance = instance.endpoint[1], instance.iid
            instance.enqueue(job, t)
        if len(queue):
            self._push(t + self.options.niw_signal_interval_s, PRIO_TICK, "niw", where)
        else:
            queue.signalling = False

    def _sample(self, _: Any, t: float) -> None:
        for key, endpoint in self.endpoints.items():
            states = [i.state for i in endpoint.instances]
            utilisation = endpoint.utilisation(t)
            self.samples.setdefault(f"{key[0]}/{key[1]}", []).append(
                [
                    t,
                    states.count(State.READY),
                    states.count(State.LOADING),
                    states.count(State.DRAINING),
                    utilisation,
                    endpoint.target,
                    endpoint.donated,
                    self.load.observed_tps(key, t, self.options.sample_interval_s),
                ]
            )
        self._push(t + self.options.sample_interval_s, PRIO_TICK, "sample", None)
        if self.options.progress is not None:
            self.options.progress(t, self.options.duration_s)


_KINDS = {"step": 0, "ready": 1, "scale": 2, "plan": 3, "sample": 4, "niw": 5}
_HANDLERS: dict[int, Any] = {
    1: FleetSimulation._ready,
    2: FleetSimulation._scale,
    3: FleetSimulation._plan,
    4: FleetSimulation._sample,
    5: FleetSimulation._niw_signal,
}


YOUNG_COLLECTION_THRESHOLD = 20_000
"""Allocations between two young-generation collections during a run (CPython's default: 700)."""


@contextmanager
def _collector_tuned() -> Iterator[None]:
    """The cyclic collector set for one run, restored afterwards.

    A run allocates a few objects per event and frees nearly all of them by reference counting;
    what the collector then does is mostly traverse what lives throughout: the fleet, the
    workload the caller built, the results. Freezing what exists at the start takes it out of
    every collection, and a larger young generation collects less often. Results cannot change
    (the collector only frees unreachable cycles); memory can grow by the garbage of one young
    generation at most.
    """
    thresholds = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0  # a caller's own frozen objects stay as they are
    if freeze:
        gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, thresholds[1], thresholds[2])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if freeze:
            gc.unfreeze()


def simulate(fleet: Fleet, workload: Iterable[SimRequest], options: SimOptions) -> SimResults:
    """Run one simulation and return its results."""
    with _collector_tuned():
        return FleetSimulation(fleet, workload, options).run()
