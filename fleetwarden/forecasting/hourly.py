"""One hourly planning round for the whole fleet: forecast per (model, region), solve, map back.

This is the pure core behind the operator's hourly timer, `fleetwarden plan` and the simulator's
`ForecastPlanner` (DESIGN section 3: one brain, several bodies). It takes the fleet as the API
specs users write, the load history per endpoint and the replicas running now, and returns a
target per endpoint with the forecast it was sized for and what the solver proved. No I/O, no
clock (`now_s` is an input), deterministic for a given input.

Steps:

1. For every ModelDeployment x region, sum the interactive tokens/s of its endpoints (a
   ModelDeployment may use several pools in one region), pad the sum with missing samples up to
   `now_s`, forecast the next `horizonSeconds` from there (`forecast.forecast`, never raises) and
   add SageServe's NIW buffer: beta (`niwBuffer`) x the mean NIW tokens/s of the past hour
   (`plan_peak`). A history silent for over `STALE_HISTORY_STEPS` before `now_s` is degraded.
2. A (model, region) with no valid sample keeps its current replicas (DESIGN section 5: never
   scale on missing data). It is left out of the integer program, and the pools it runs on lose
   the GPUs and instance slots it holds, so the rest of the fleet is planned around it.
3. Build the planner's `PlanInput` and solve (`planner.plan`).
4. Map instance counts back to endpoints and keep every endpoint within its own
   [minInstances, maxInstances], then give back what a raised minimum overfilled
   (`hourly_placement`; see below).

Why every RegionPool is its own "GPU type" in the planner: the planner indexes pools by
(region, GPU type), but a ModelDeployment names pools, not GPU types. Keying the planner's pools by
RegionPool name gives each model a throughput only on the pools it actually lists (an H100 pool
the model does not use in that region gets no variable), lets two pools of one GPU type in one
region keep their own capacity and cost, and makes the mapping back exact: one planner triple is
one endpoint, so no split heuristic can overfill a pool. The planner's region bounds are summed
over a region's placements, so it may leave a placement below its own minimum (and fill that pool
with other models), or, when the pools cannot hold the minimums, the whole region short of them
(`Plan.short_min`). Each placement's own min/max is restored afterwards: instances move between a
region's placements where they can; a minimum that still lands in a pool the plan filled makes the
pool shed other endpoints' instances above their minimums (a binding line says so). Only a pool
that the minimums and held replicas alone overfill ends over its capacity, and is reported in
`RoundResult.overcommitted`.

Invalid fleets (a placement naming an unknown pool, a pool whose GPU type has no throughput entry)
raise `FleetPlanError`; the operator leaves such ModelDeployments out of the round (holding their
replicas) and says why in their conditions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from fleetwarden.api.v1alpha1.modeldeployment import ForecastSettings, ModelDeploymentSpec
from fleetwarden.api.v1alpha1.regionpool import RegionPoolSpec
from fleetwarden.forecasting.fallbacks import hours
from fleetwarden.forecasting.forecast import (
    DEFAULT_CONFIG,
    Forecast,
    ForecastConfig,
    forecast,
    plan_peak,
)
from fleetwarden.forecasting.hourly_placement import (
    EndpointKey as EndpointKey,
)
from fleetwarden.forecasting.hourly_placement import (
    Free,
    Resolved,
    free_add,
    per_placement,
    relieve,
)
from fleetwarden.forecasting.planner import (
    ModelSpec,
    Plan,
    PlanInput,
    PlannerConfig,
    PoolSpec,
    RegionBounds,
    plan,
)
from fleetwarden.forecasting.series import Series
from fleetwarden.forecasting.series_sum import last_hour_mean, sum_series
from fleetwarden.forecasting.warm import WarmForecaster

PairKey = tuple[str, str]
"""(ModelDeployment `namespace/name`, region)."""

STALE_HISTORY_STEPS = 3
"""Steps without a valid sample at a history's end, up to `now_s`, beyond which its forecast is
degraded (`EndpointPlan.healthy` False). A lost scrape or two is routine; a longer silence means
the series stopped (no pods, a restart, a broken scrape): not a healthy `arima`."""


class FleetPlanError(ValueError):
    """The fleet cannot be planned as written (not merely infeasible): says which object."""


@dataclass(frozen=True)
class FleetSpecs:
    """The fleet as the API specs: RegionPools by name, ModelDeployments by `namespace/name`."""

    pools: Mapping[str, RegionPoolSpec]
    model_deployments: Mapping[str, ModelDeploymentSpec]


@dataclass(frozen=True)
class EndpointHistory:
    """Tokens/s of one endpoint as Prometheus holds them, oldest first (NaN = missing)."""

    iw_tps: Series
    """Interactive tokens/s: what is forecast."""
    niw_tps: Series | None = None
    """NIW (batch) tokens/s: beta x its last-hour mean is added to the planned peak."""


@dataclass(frozen=True)
class PoolUsage:
    """GPUs and instance slots of a pool taken by something outside this round."""

    instances: int = 0
    gpus: int = 0


@dataclass(frozen=True)
class RoundInput:
    fleet: FleetSpecs
    history: Mapping[EndpointKey, EndpointHistory]
    """Per endpoint; endpoints of one (model, region) are summed. An absent endpoint adds
    nothing (the operator, whose series are per region, attaches a region's series to one
    endpoint of it)."""
    current: Mapping[EndpointKey, int]
    """Replicas per endpoint now; absent means minInstances."""
    now_s: float
    """History after `now_s` is ignored; the forecast starts at `now_s` (within one step): a
    history ending earlier is padded with missing samples up to it."""
    reserved: Mapping[str, PoolUsage] = field(default_factory=dict)
    """Pool name -> capacity used by ModelDeployments outside the round (e.g. invalid specs)."""


@dataclass(frozen=True)
class RegionForecast:
    """The forecast of one (model, region) and the peak the plan was sized for."""

    model_deployment: str
    region: str
    forecast: Forecast
    niw_tps: float
    """Mean NIW tokens/s of the past hour (0 without a series)."""
    peak_tps: float | None
    """forecast peak + beta x niw_tps; None when there was no data (the region is held)."""
    stale_reason: str | None = None
    """Set when the history stopped more than `STALE_HISTORY_STEPS` before `now_s`."""

    @property
    def healthy(self) -> bool:
        """The default model ran on a history that reaches `now_s`: ForecastHealthy."""
        return self.forecast.healthy and self.stale_reason is None

    @property
    def degraded_reason(self) -> str | None:
        """Why the forecast is not healthy (fallback and staleness), None when it is."""
        reasons = [r for r in (self.forecast.fallback_reason, self.stale_reason) if r]
        return "; ".join(reasons) or None


@dataclass(frozen=True)
class EndpointPlan:
    """The round's answer for one endpoint."""

    model_deployment: str
    pool: str
    region: str
    current: int
    target: int
    region_peak_tps: float | None
    """Planned peak of the endpoint's (model, region); None when held for lack of data."""
    forecast_peak_tps: float | None
    """This endpoint's share of the region's peak, by planned capacity (equal to the region's
    peak when it is the model's only pool there)."""
    forecast_model: str
    """`arima`, `seasonal-naive`, `last-peak` or `no-data`."""
    healthy: bool
    """ARIMA ran on a history reaching now; the operator's ForecastHealthy condition."""
    fallback_reason: str | None
    """Why not healthy: the forecast's fallback reason and/or the history's staleness."""
    held: bool
    """No data for this (model, region): the target is the current count."""
    cost_per_hour: float

    @property
    def delta(self) -> int:
        return self.target - self.current


@dataclass(frozen=True)
class RoundResult:
    now_s: float
    endpoints: Mapping[EndpointKey, EndpointPlan]
    forecasts: Mapping[PairKey, RegionForecast]
    plan: Plan | None
    """The solver's plan; None when nothing was left to solve (every region held)."""
    status: str
    """The solver's status (optimal, feasible, infeasible, no_solution) or `nothing-to-plan`."""
    gap: float | None
    cost_per_hour: float
    """Hourly cost of every endpoint's target, held ones included."""
    binding: tuple[str, ...]
    """Human lines: unserved demand, minimums the pools cannot hold, full pools, regions at max."""
    overcommitted: tuple[str, ...] = ()
    """Pools whose minInstances and held regions alone exceed them (the operator reports it)."""

    @property
    def solved(self) -> bool:
        """True when the targets come from a plan (or nothing needed one)."""
        return self.plan is None or self.plan.has_plan

    @property
    def has_data(self) -> bool:
        return any(f.peak_tps is not None for f in self.forecasts.values())

    def held_regions(self, model_deployment: str) -> list[str]:
        return self.held_regions_by_model().get(model_deployment, [])

    def held_regions_by_model(self) -> dict[str, list[str]]:
        """ModelDeployment -> its held regions, sorted: one pass, not one per ModelDeployment."""
        out: dict[str, list[str]] = {}
        for f in (f for f in self.forecasts.values() if f.peak_tps is None):
            out.setdefault(f.model_deployment, []).append(f.region)
        return {md: sorted(regions) for md, regions in out.items()}


def forecast_config(
    settings: ForecastSettings, base: ForecastConfig = DEFAULT_CONFIG
) -> ForecastConfig:
    """`base` with the ModelDeployment's horizon and, when given, its fixed ARIMA order."""
    order = tuple(settings.order) if settings.order else None
    return replace(
        base,
        horizon_s=float(settings.horizon_seconds),
        orders=base.orders if order is None else ((order[0], order[1], order[2]),),
    )


def _resolve(fleet: FleetSpecs) -> dict[str, list[Resolved]]:
    """Every ModelDeployment's endpoints joined with their pools; FleetPlanError if one dangles."""
    out: dict[str, list[Resolved]] = {}
    for md_key, spec in sorted(fleet.model_deployments.items()):
        endpoints = []
        for placement in spec.regions:
            pool = fleet.pools.get(placement.pool)
            if pool is None:
                raise FleetPlanError(
                    f"ModelDeployment {md_key}: RegionPool {placement.pool!r} does not exist"
                )
            theta = spec.throughput.get(pool.gpu_type)
            if theta is None:
                raise FleetPlanError(
                    f"ModelDeployment {md_key}: no throughput for GPU type {pool.gpu_type!r} "
                    f"of pool {placement.pool}"
                )
            endpoints.append(
                Resolved(
                    (md_key, placement.pool),
                    pool.region,
                    placement.min_instances,
                    placement.max_instances,
                    float(theta),
                    spec.model.gpus_per_instance,
                )
            )
        out[md_key] = endpoints
    return out


def _current(inp: RoundInput, e: Resolved) -> int:
    """Current replicas, kept within the placement's bounds (min/max always hold)."""
    n = inp.current.get(e.key, e.min_instances)
    return max(e.min_instances, min(e.max_instances, int(n)))


def _held(forecasts: Mapping[PairKey, RegionForecast], e: Resolved) -> bool:
    """The endpoint's (model, region) has no data: it keeps its current replicas."""
    return forecasts[(e.key[0], e.region)].peak_tps is None


def _forecasts(
    inp: RoundInput,
    resolved: Mapping[str, list[Resolved]],
    base: ForecastConfig,
    warm: WarmForecaster | None,
) -> dict[PairKey, RegionForecast]:
    out: dict[PairKey, RegionForecast] = {}
    for md_key, endpoints in resolved.items():
        settings = inp.fleet.model_deployments[md_key].scaling.forecast
        config = forecast_config(settings, base)
        for region in dict.fromkeys(e.region for e in endpoints):
            histories = [inp.history.get(e.key) for e in endpoints if e.region == region]
            known = [h for h in histories if h is not None]
            iw = sum_series([h.iw_tps.until(inp.now_s) for h in known])
            niw = sum_series([h.niw_tps for h in known if h.niw_tps is not None])
            # the hour after now, not after the last sample; no longer than forecast() reads
            keep_s = max(config.max_history_s, 0.0 if iw is None else iw.duration_s)
            series = Series.of([]) if iw is None else iw.padded_to(inp.now_s, keep_s=keep_s)
            if warm is None:
                result = forecast(series, config)
            else:
                result = warm.forecast((md_key, region), series, config, now_s=inp.now_s)
            niw_tps = last_hour_mean(niw, inp.now_s)
            peak = plan_peak(result, niw_tps, settings.niw_buffer) if result.has_data else None
            stale = _stale_reason(series)
            out[(md_key, region)] = RegionForecast(md_key, region, result, niw_tps, peak, stale)
    if warm is not None:
        warm.keep_only(out.keys())
    return out


def _stale_reason(series: Series) -> str | None:
    """Why a history padded to now is too old to call its forecast healthy, or None."""
    missing = series.trailing_missing()
    if not series.values or missing <= STALE_HISTORY_STEPS:
        return None
    gap = hours(missing * series.step_s)
    return f"no tokens/s sample in the {gap} before the round: the series stopped, forecast over it"


def build_plan_input(
    inp: RoundInput,
    resolved: Mapping[str, list[Resolved]],
    forecasts: Mapping[PairKey, RegionForecast],
) -> PlanInput:
    """The planner's input: models with data, pools less what held endpoints occupy."""
    used: dict[str, PoolUsage] = dict(inp.reserved)
    models: list[ModelSpec] = []
    current: dict[tuple[str, str, str], int] = {}
    peaks: dict[tuple[str, str], float] = {}
    for md_key, endpoints in resolved.items():
        spec = inp.fleet.model_deployments[md_key]
        throughput: dict[str, float] = {}
        bounds: dict[str, RegionBounds] = {}
        for e in endpoints:
            n = _current(inp, e)
            region_forecast = forecasts[(md_key, e.region)]
            if region_forecast.peak_tps is None:  # held: its instances stay where they are
                before = used.get(e.key[1], PoolUsage())
                used[e.key[1]] = PoolUsage(before.instances + n, before.gpus + n * e.gpus)
                continue
            throughput[e.key[1]] = e.throughput
            b = bounds.get(e.region, RegionBounds(0, 0))
            bounds[e.region] = RegionBounds(
                b.min_instances + e.min_instances, b.max_instances + e.max_instances
            )
            current[(md_key, e.region, e.key[1])] = n
            peaks[(md_key, e.region)] = region_forecast.peak_tps
        if not bounds:
            continue
        models.append(
            ModelSpec(
                name=md_key,
                throughput=throughput,
                regions=bounds,
                gpus_per_instance=spec.model.gpus_per_instance,
                epsilon=spec.scaling.epsilon,
                startup_cost=spec.startup_cost,
            )
        )
    pools = []
    for name, pool in sorted(inp.fleet.pools.items()):
        taken = used.get(name, PoolUsage())
        cap = pool.capacity
        pools.append(
            PoolSpec(
                region=pool.region,
                gpu_type=name,
                cost_per_gpu_hour=pool.cost_per_hour,
                gpus=None if cap.gpus is None else max(0, cap.gpus - taken.gpus),
                instances=None
                if cap.instances is None
                else max(0, cap.instances - taken.instances),
                load_seconds=float(pool.model_load_seconds),
            )
        )
    return PlanInput(models=tuple(models), pools=tuple(pools), current=current, peak=peaks)


def _binding(p: Plan) -> tuple[str, ...]:
    lines = [
        f"{u.model}{'' if u.region is None else '/' + u.region}: {u.tokens_per_s:.0f} tokens/s "
        "of the forecast peak cannot be served"
        for u in p.unserved
    ]
    lines += [
        f"{s.model}/{s.region}: {s.missing} instances short of minInstances" for s in p.short_min
    ]
    lines += [f"pool {u.gpu_type} ({u.region}) is full" for u in p.full_pools]
    lines += [f"{model}/{region}: at maxInstances" for model, region in p.at_max]
    return tuple(lines)


def plan_round(
    inp: RoundInput,
    *,
    forecast_base: ForecastConfig = DEFAULT_CONFIG,
    planner_config: PlannerConfig | None = None,
    warm: WarmForecaster | None = None,
) -> RoundResult:
    """One round; raises FleetPlanError for a fleet that cannot be planned as written.

    `warm`, owned by a caller that plans many rounds of one fleet (the simulator), caches the
    ARIMA fits per (model, region) across rounds (`forecasting.warm`); without it every round
    fits fresh, as the operator does.
    """
    resolved = _resolve(inp.fleet)
    forecasts = _forecasts(inp, resolved, forecast_base, warm)
    spec = build_plan_input(inp, resolved, forecasts)
    solved: Plan | None = None
    if spec.models:
        try:
            solved = plan(spec, planner_config)
        except ValueError as exc:  # malformed planner input: the fleet's numbers are unusable
            raise FleetPlanError(f"the planner refused the fleet: {exc}") from exc
    counts = {} if solved is None else solved.targets

    held = {e.key for es in resolved.values() for e in es if _held(forecasts, e)}
    targets: dict[EndpointKey, int] = {}
    for md_key, endpoints in resolved.items():
        for e in endpoints:
            key3 = (md_key, e.region, e.pool)
            n = _current(inp, e)
            targets[e.key] = n if e.key in held else counts.get(key3, n)
    free = _free_capacity(inp, resolved, targets)
    for endpoints in resolved.values():
        for region in dict.fromkeys(e.region for e in endpoints):
            members = [e for e in endpoints if e.region == region]
            if members[0].key not in held:
                per_placement(targets, members, free)
    overcommitted, dropped = relieve(targets, resolved, held, free)

    endpoints_out: dict[EndpointKey, EndpointPlan] = {}
    total_cost = 0.0
    for md_key, endpoints in resolved.items():
        for e in endpoints:
            rf = forecasts[(md_key, e.region)]
            same = [o for o in endpoints if o.region == e.region]
            share = _share(e, same, targets)
            pool = inp.fleet.pools[e.key[1]]
            cost = targets[e.key] * e.gpus * pool.cost_per_hour
            total_cost += cost
            endpoints_out[e.key] = EndpointPlan(
                model_deployment=md_key,
                pool=e.key[1],
                region=e.region,
                current=_current(inp, e),
                target=targets[e.key],
                region_peak_tps=rf.peak_tps,
                forecast_peak_tps=None if rf.peak_tps is None else rf.peak_tps * share,
                forecast_model=str(rf.forecast.model),
                healthy=rf.healthy,
                fallback_reason=rf.degraded_reason,
                held=rf.peak_tps is None,
                cost_per_hour=cost,
            )
    return RoundResult(
        now_s=inp.now_s,
        endpoints=endpoints_out,
        forecasts=forecasts,
        plan=solved,
        status="nothing-to-plan" if solved is None else str(solved.status.value),
        gap=None if solved is None else solved.gap,
        cost_per_hour=total_cost,
        binding=(() if solved is None else _binding(solved))
        + tuple(
            f"{md}: {n} instances fewer in pool {name} to make room for minInstances"
            for (md, name), n in sorted(dropped.items())
        )
        + tuple(f"pool {name} is overcommitted by minInstances" for name in overcommitted),
        overcommitted=overcommitted,
    )


def _share(e: Resolved, same: list[Resolved], targets: Mapping[EndpointKey, int]) -> float:
    """The endpoint's part of its region's capacity as planned (equal parts if all are zero)."""
    if len(same) == 1:
        return 1.0
    total = sum(targets[o.key] * o.throughput for o in same)
    if total <= 0:
        return 1.0 / len(same)
    return targets[e.key] * e.throughput / total


def _free_capacity(
    inp: RoundInput, resolved: Mapping[str, list[Resolved]], targets: Mapping[EndpointKey, int]
) -> Free:
    """(GPUs, slots) left per pool under the targets; None where the pool gives no such bound."""
    free: Free = {}
    for name, pool in inp.fleet.pools.items():
        taken = inp.reserved.get(name, PoolUsage())
        free[name] = (
            None if pool.capacity.gpus is None else pool.capacity.gpus - taken.gpus,
            None if pool.capacity.instances is None else pool.capacity.instances - taken.instances,
        )
    for endpoints in resolved.values():
        for e in endpoints:
            free_add(free, e, -targets[e.key])
    return free
