"""Inputs of the capacity planner (SageServe section 5) and their compilation into index arrays.

The planner decides, once an hour, how many serving instances of every model run in every pool
(a pool is one GPU type in one region). Inputs are plain frozen dataclasses so that the operator,
the `fleetwarden plan` command and the simulator can all build them from their own sources, and so
that a plan can be recomputed from a logged input. `compile_problem` turns them into flat numpy
arrays indexed by *triple* (model, pool): the formulations in `planner_mip` are written against
those arrays only, never against names.

Units: throughput and demand in tokens/s, cost per hour, load time in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DEFAULT_LOAD_SECONDS = 600.0
"""SageServe measures about 10 minutes from VM start to a serving model instance."""

DEFAULT_CHANGE_PENALTY = 0.005
"""Half of the default 1% gap: even a plan that replaces the whole fleet pays at most the gap
for its penalty (see `PlannerConfig.change_penalty`)."""


@dataclass(frozen=True)
class RegionBounds:
    """Fewest and most instances of one model in one region, summed over its GPU types."""

    min_instances: int = 0
    max_instances: int = 10_000


@dataclass(frozen=True)
class ModelSpec:
    """One model to place: what an instance of it serves on each GPU type, and where it may run.

    A model runs in region r on GPU type k only if `regions` has r and `throughput` has k.
    """

    name: str
    throughput: Mapping[str, float]
    """Tokens/s one instance serves, per GPU type (SageServe's theta[i,k])."""
    regions: Mapping[str, RegionBounds]
    """Regions the model may run in, with min/max instances there."""
    gpus_per_instance: int = 1
    epsilon: float = 1.0
    """Share of each region's peak that must be served in that region; the rest may be rerouted."""
    load_seconds: float | None = None
    """Time to start one instance; None uses the pool's `load_seconds`."""
    startup_cost: float | None = None
    """Cost of starting one instance (SageServe's sigma); None derives load time x hourly cost."""


@dataclass(frozen=True)
class PoolSpec:
    """GPUs of one type in one region, shared by every model placed there.

    Capacity may be given in GPUs, in instances (e.g. a node count), or both; each bound given holds.
    Cost is per GPU-hour as in the RegionPool CRD, so one instance of a model costs
    `gpus_per_instance * cost_per_gpu_hour` per hour (SageServe's alpha_k for one-GPU instances).
    """

    region: str
    gpu_type: str
    cost_per_gpu_hour: float
    gpus: int | None = None
    instances: int | None = None
    load_seconds: float = DEFAULT_LOAD_SECONDS


@dataclass(frozen=True)
class PlanInput:
    """Everything one planning round needs: the fleet, what runs now, and the forecast peaks."""

    models: tuple[ModelSpec, ...]
    pools: tuple[PoolSpec, ...]
    current: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    """Instances running now per (model, region, GPU type) (SageServe's n[i,j,k]); missing = 0."""
    peak: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """Peak tokens/s to plan for per (model, region) (the forecast peak plus NIW buffer)."""


class SolverName(StrEnum):
    HIGHS = "highs"
    CBC = "cbc"


class Formulation(StrEnum):
    TIGHT = "tight"
    """Instance counts as variables, MIR cuts, LP-rounding heuristic: the default."""
    NAIVE = "naive"
    """The paper's delta variables handed to the solver as they are: for tests and benchmarks."""


@dataclass(frozen=True)
class PlannerConfig:
    """Solver knobs. The gap is relative to the hourly cost of the planned fleet (see docs)."""

    solver: SolverName = SolverName.HIGHS
    fallback: bool = True
    """Use CBC (bundled with PuLP) when HiGHS is missing or fails."""
    time_limit_seconds: float = 30.0
    mip_rel_gap: float = 0.01
    mip_abs_gap: float = 1e-6
    formulation: Formulation = Formulation.TIGHT
    cut_rounds: int = 6
    """Rounds of mixed-integer rounding cuts added to the LP relaxation before branching."""
    penalty_factor: float = 1000.0
    """When the pools cannot serve the forecast, each unserved instance-equivalent of demand costs
    this many times the dearest way to serve it, so the plan serves all that fits first."""
    threads: int = 1
    change_penalty: float = DEFAULT_CHANGE_PENALTY
    """Each instance started or stopped costs this share of its hourly cost in the objective
    (on top of start-up cost), so among plans of (nearly) equal cost the one nearest today's
    fleet wins. Solved exactly, the plan then costs (hourly plus start-up) at most this share of
    the hourly cost of the instances the cheapest plan starts and stops more than the cheapest
    plan (docs/planner.md). In [0, 1)."""

    def __post_init__(self) -> None:
        """A penalty of a whole instance-hour or more would make keeping an unneeded instance
        free (its column cost would drop to zero or below): the plan would never shrink."""
        if not (math.isfinite(self.change_penalty) and 0.0 <= self.change_penalty < 1.0):
            raise ValueError(f"change_penalty must be in [0, 1), got {self.change_penalty!r}")


@dataclass(frozen=True)
class Problem:
    """Flat arrays over triples t = (model, pool) where the model may run; see module docstring."""

    spec: PlanInput
    regions: tuple[str, ...]
    t_model: IntArray
    t_pool: IntArray
    t_region: IntArray
    t_theta: FloatArray
    t_cost: FloatArray
    """Cost per instance-hour."""
    t_sigma: FloatArray
    """Cost of starting one instance."""
    t_change: FloatArray
    """Penalty per instance started or stopped: `change_penalty` x cost per instance-hour."""
    t_current: IntArray
    t_upper: IntArray
    """Most instances the triple can hold: region max, pool GPUs and pool instances."""
    t_pair: IntArray
    """Index of the triple's (model, region) pair in the mr_* arrays."""
    mr_model: IntArray
    """(model, region) pairs the model may run in or has demand in: model index."""
    mr_region: IntArray
    mr_min: IntArray
    mr_max: IntArray
    mr_demand: FloatArray
    """epsilon * peak, tokens/s."""
    mr_peak: FloatArray
    model_total: FloatArray
    """Sum of the model's peaks over all regions, tokens/s."""
    model_theta_max: FloatArray
    """Fastest instance of the model, tokens/s: demand rows are scaled by it."""
    model_gpus: IntArray
    pool_gpus: IntArray
    """GPU capacity per pool, -1 when not given."""
    pool_instances: IntArray
    """Instance capacity per pool, -1 when not given."""
    current_cost: float
    """Hourly cost of every instance running now."""

    @property
    def n_triples(self) -> int:
        return int(self.t_model.size)

    @property
    def n_models(self) -> int:
        return len(self.spec.models)

    def triples_of_model(self, i: int) -> IntArray:
        return np.flatnonzero(self.t_model == i)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _finite_nonnegative(value: float) -> bool:
    return math.isfinite(value) and value >= 0


def _validate(spec: PlanInput) -> None:
    """Reject malformed input early: a planner that guesses at a typo plans the wrong fleet.

    Numbers must be finite: an infinite throughput or cost turns the scaled rows and the
    objective into NaN, and the solver then "serves" demand with no instance or finds no plan,
    with nothing in the report to say why (YAML spells infinity `.inf`, so it does get typed).
    """
    names = [m.name for m in spec.models]
    _check(len(set(names)) == len(names), "model names must be unique")
    keys = [(p.region, p.gpu_type) for p in spec.pools]
    _check(len(set(keys)) == len(keys), "one pool per (region, GPU type)")
    for m in spec.models:
        _check(m.gpus_per_instance >= 1, f"{m.name}: gpus_per_instance must be >= 1")
        _check(0 < m.epsilon <= 1, f"{m.name}: epsilon must be in (0, 1]")
        _check(
            all(_finite_nonnegative(v) for v in m.throughput.values()),
            f"{m.name}: throughput must be finite, >= 0",
        )
        for what, value in (("load_seconds", m.load_seconds), ("startup_cost", m.startup_cost)):
            _check(
                value is None or _finite_nonnegative(value),
                f"{m.name}: {what} must be finite, >= 0",
            )
        for region, b in m.regions.items():
            _check(
                0 <= b.min_instances <= b.max_instances,
                f"{m.name}/{region}: need 0 <= min_instances <= max_instances",
            )
    for p in spec.pools:
        _check(
            _finite_nonnegative(p.cost_per_gpu_hour),
            f"{p.region}/{p.gpu_type}: cost must be finite, >= 0",
        )
        _check(
            _finite_nonnegative(p.load_seconds),
            f"{p.region}/{p.gpu_type}: load_seconds must be finite, >= 0",
        )
        _check(p.gpus is None or p.gpus >= 0, f"{p.region}/{p.gpu_type}: negative GPUs")
        _check(p.instances is None or p.instances >= 0, f"{p.region}/{p.gpu_type}: negative cap")
    known = set(names)
    for (model, region, gpu), n in spec.current.items():
        _check(model in known, f"current count for unknown model {model}")
        _check((region, gpu) in set(keys), f"current count for unknown pool {region}/{gpu}")
        _check(n >= 0, f"negative current count for {model}/{region}/{gpu}")
    for (model, _region), value in spec.peak.items():
        _check(model in known, f"peak for unknown model {model}")
        _check(_finite_nonnegative(value), f"peak for {model} must be finite, >= 0")


def _sigma(model: ModelSpec, pool: PoolSpec, cost: float) -> float:
    """SageServe: sigma = alpha x start-up time, i.e. the hour's cost of a not-yet-serving VM."""
    if model.startup_cost is not None:
        return model.startup_cost
    load = pool.load_seconds if model.load_seconds is None else model.load_seconds
    return cost * load / 3600.0


def compile_problem(spec: PlanInput, change_penalty: float = 0.0) -> Problem:
    """Index the input; raises ValueError on malformed (not merely infeasible) input.

    `change_penalty` is `PlannerConfig.change_penalty` (0: the paper's objective as it is).
    """
    _validate(spec)
    _check(
        math.isfinite(change_penalty) and 0.0 <= change_penalty < 1.0,
        f"change_penalty must be in [0, 1), got {change_penalty!r}",
    )
    models, pools = spec.models, spec.pools
    named = {p.region for p in pools} | {r for m in models for r in m.regions}
    regions = tuple(sorted(named | {r for _, r in spec.peak}))
    region_index = {r: j for j, r in enumerate(regions)}
    pool_index = {(p.region, p.gpu_type): q for q, p in enumerate(pools)}

    rows: list[tuple[int, int, int, float, float, float, int, int]] = []
    for i, m in enumerate(models):
        g = m.gpus_per_instance
        for q, p in enumerate(pools):
            theta = m.throughput.get(p.gpu_type, 0.0)
            bounds = m.regions.get(p.region)
            if theta <= 0 or bounds is None:
                continue
            upper = bounds.max_instances
            if p.gpus is not None:
                upper = min(upper, p.gpus // g)
            if p.instances is not None:
                upper = min(upper, p.instances)
            cost = g * p.cost_per_gpu_hour
            n = spec.current.get((m.name, p.region, p.gpu_type), 0)
            rows.append((i, q, region_index[p.region], theta, cost, _sigma(m, p, cost), n, upper))

    model_index = {m.name: i for i, m in enumerate(models)}
    current_cost = 0.0
    for (model, region, gpu), n in spec.current.items():
        i, q = model_index[model], pool_index[(region, gpu)]
        current_cost += n * models[i].gpus_per_instance * pools[q].cost_per_gpu_hour

    pairs: dict[tuple[int, int], tuple[int, int, float]] = {}
    for i, m in enumerate(models):
        for region, b in m.regions.items():
            pairs[(i, region_index[region])] = (b.min_instances, b.max_instances, 0.0)
    for (model, region), value in spec.peak.items():
        key = (model_index[model], region_index[region])
        lo, hi, _ = pairs.get(key, (0, 0, 0.0))
        pairs[key] = (lo, hi, value)
    ordered = sorted(pairs)
    pair_index = {key: k for k, key in enumerate(ordered)}
    total = np.zeros(len(models))
    for (i, _j), (_lo, _hi, value) in pairs.items():
        total[i] += value

    t = np.array(rows, dtype=np.float64).reshape(-1, 8)
    theta_max = np.zeros(len(models))
    for i, m in enumerate(models):
        theta_max[i] = max([v for v in m.throughput.values() if v > 0], default=1.0)
    eps = np.array([m.epsilon for m in models])
    mr_model = np.array([i for i, _ in ordered], dtype=np.int64)
    mr_peak = np.array([pairs[k][2] for k in ordered])
    return Problem(
        spec=spec,
        regions=regions,
        t_model=t[:, 0].astype(np.int64),
        t_pool=t[:, 1].astype(np.int64),
        t_region=t[:, 2].astype(np.int64),
        t_theta=t[:, 3].copy(),
        t_cost=t[:, 4].copy(),
        t_sigma=t[:, 5].copy(),
        t_change=change_penalty * t[:, 4],
        t_current=t[:, 6].astype(np.int64),
        t_upper=t[:, 7].astype(np.int64),
        t_pair=np.array([pair_index[(int(r[0]), int(r[2]))] for r in rows], dtype=np.int64),
        mr_model=mr_model,
        mr_region=np.array([j for _, j in ordered], dtype=np.int64),
        mr_min=np.array([pairs[k][0] for k in ordered], dtype=np.int64),
        mr_max=np.array([pairs[k][1] for k in ordered], dtype=np.int64),
        mr_demand=mr_peak * eps[mr_model] if ordered else np.zeros(0),
        mr_peak=mr_peak,
        model_total=total,
        model_theta_max=theta_max,
        model_gpus=np.array([m.gpus_per_instance for m in models], dtype=np.int64),
        pool_gpus=np.array([-1 if p.gpus is None else p.gpus for p in pools], dtype=np.int64),
        pool_instances=np.array(
            [-1 if p.instances is None else p.instances for p in pools], dtype=np.int64
        ),
        current_cost=current_cost,
    )
