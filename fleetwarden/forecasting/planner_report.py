"""The planner's answer as data: targets, deltas, costs, proof, and what binds.

Everything here is computed from the final instance counts and the input, not from solver
internals (slack values, duals), so a plan reads the same whichever solver or formulation made it,
and a test can recompute every number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetwarden.forecasting.planner_mip import RunStatus
from fleetwarden.forecasting.planner_model import IntArray, Problem

_TOL = 1e-6


@dataclass(frozen=True)
class PlanEntry:
    """One (model, region, GPU type): what runs now, what should run, and what that costs."""

    model: str
    region: str
    gpu_type: str
    current: int
    target: int
    cost_per_hour: float
    """Hourly cost of the target instances."""
    startup_cost: float
    """Cost of starting the new instances (zero when shrinking)."""

    @property
    def delta(self) -> int:
        return self.target - self.current


@dataclass(frozen=True)
class Unserved:
    """Demand the plan cannot serve, tokens/s.

    `region` None is the model's total over regions, reported when epsilon < 1 (some demand
    may be served elsewhere); with epsilon = 1 the per-region entries are the whole story.
    """

    model: str
    region: str | None
    tokens_per_s: float


@dataclass(frozen=True)
class MinShortfall:
    model: str
    region: str
    missing: int


@dataclass(frozen=True)
class PoolUse:
    region: str
    gpu_type: str
    used_gpus: int
    used_instances: int
    gpus: int | None
    instances: int | None
    full: bool
    """No model placed here could start one more instance for lack of GPUs or slots."""


@dataclass(frozen=True)
class Plan:
    entries: tuple[PlanEntry, ...]
    status: RunStatus
    """optimal: within the gap (proven); feasible: a plan, gap unproven (time limit);
    no_solution / infeasible: nothing to apply, entries hold the current counts. A plan that
    keeps the current counts because nothing found was cheaper (method `keep-current`) is
    optimal when that is proven (the solver's answer was, or staying is within the gap of the
    bound), else feasible."""
    relaxed: bool
    """The forecast does not fit: demand or min instances go short (see unserved, short_min)."""
    solver: str
    method: str
    """How it was found: lp-bound+heuristic, branch-and-bound, keep-current, trivial, ..."""
    formulation: str
    cost_per_hour: float
    startup_cost: float
    objective: float
    """SageServe's objective: change in hourly cost plus start-up cost of new instances."""
    solver_objective: float
    """What was minimised: cost_per_hour + startup_cost + change_penalty (+ penalties when
    relaxed)."""
    change_penalty: float
    """The change penalty the plan pays in solver_objective (`PlannerConfig.change_penalty` x
    hourly cost, per instance started or stopped): not a cost, the price a move had to beat."""
    bound: float | None
    """Proven lower bound on solver_objective, when the solver exposes one."""
    gap: float | None
    """Proven relative gap (solver_objective - bound) / solver_objective; None when unknown."""
    solve_seconds: float
    unserved: tuple[Unserved, ...]
    short_min: tuple[MinShortfall, ...]
    pools: tuple[PoolUse, ...]
    at_max: tuple[tuple[str, str], ...]
    """(model, region) pairs planned at their max_instances."""

    @property
    def targets(self) -> dict[tuple[str, str, str], int]:
        return {(e.model, e.region, e.gpu_type): e.target for e in self.entries}

    @property
    def deltas(self) -> dict[tuple[str, str, str], int]:
        return {(e.model, e.region, e.gpu_type): e.delta for e in self.entries}

    @property
    def full_pools(self) -> tuple[PoolUse, ...]:
        return tuple(u for u in self.pools if u.full)

    @property
    def has_plan(self) -> bool:
        return self.status in (RunStatus.OPTIMAL, RunStatus.FEASIBLE)


def _pool_use(p: Problem, x: IntArray) -> tuple[PoolUse, ...]:
    """Use per pool; full means no model placed there could start one more instance in it."""
    g = p.model_gpus[p.t_model]
    out = []
    for q, pool in enumerate(p.spec.pools):
        members = p.t_pool == q
        gpus = int((g * x)[members].sum())
        count = int(x[members].sum())
        full = False
        if np.any(members):
            no_gpus = pool.gpus is not None and pool.gpus - gpus < int(g[members].min())
            no_slots = pool.instances is not None and pool.instances - count < 1
            full = no_gpus or no_slots
        out.append(
            PoolUse(pool.region, pool.gpu_type, gpus, count, pool.gpus, pool.instances, full)
        )
    return tuple(out)


def make_plan(
    p: Problem,
    counts: IntArray | None,
    *,
    status: RunStatus,
    relaxed: bool,
    solver: str,
    method: str,
    formulation: str,
    objective: float,
    bound: float | None,
    gap: float | None,
    seconds: float,
) -> Plan:
    """Assemble the Plan; with no counts (nothing solved) every target is the current count."""
    spec = p.spec
    x = p.t_current.copy() if counts is None else counts
    names = [m.name for m in spec.models]
    pools = spec.pools
    entries = []
    seen = set()
    for t in range(p.n_triples):
        m, pool = names[p.t_model[t]], pools[p.t_pool[t]]
        key = (m, pool.region, pool.gpu_type)
        seen.add(key)
        new = max(0, int(x[t]) - int(p.t_current[t]))
        entries.append(
            PlanEntry(
                *key,
                int(p.t_current[t]),
                int(x[t]),
                float(p.t_cost[t] * x[t]),
                float(p.t_sigma[t] * new),
            )
        )
    gpus = {m.name: m.gpus_per_instance for m in spec.models}
    price = {(q.region, q.gpu_type): q.cost_per_gpu_hour for q in pools}
    for key, n in sorted(spec.current.items()):
        if key not in seen and n > 0:  # the model may no longer run there: it stops
            target = int(n) if counts is None else 0
            each = gpus[key[0]] * price[(key[1], key[2])]
            entries.append(PlanEntry(*key, int(n), target, target * each, 0.0))
    cost = sum(e.cost_per_hour for e in entries)
    startup = sum(e.startup_cost for e in entries)

    served = p.t_theta * x
    unserved: list[Unserved] = []
    short: list[MinShortfall] = []
    at_max: list[tuple[str, str]] = []
    for k in range(p.mr_model.size):
        i, j = int(p.mr_model[k]), int(p.mr_region[k])
        members = p.t_pair == k
        gap_tps = float(p.mr_demand[k] - served[members].sum())
        if gap_tps > _TOL * max(1.0, float(p.mr_demand[k])):
            unserved.append(Unserved(names[i], p.regions[j], gap_tps))
        count = int(x[members].sum())
        if count < p.mr_min[k]:
            short.append(MinShortfall(names[i], p.regions[j], int(p.mr_min[k]) - count))
        if count >= p.mr_max[k] and np.any(members):
            at_max.append((names[i], p.regions[j]))
    for i, name in enumerate(names):
        if spec.models[i].epsilon >= 1.0:
            continue  # nothing may move between regions: the regions' shortfalls say it all
        gap_tps = float(p.model_total[i] - served[p.t_model == i].sum())
        if gap_tps > _TOL * max(1.0, float(p.model_total[i])):
            unserved.append(Unserved(name, None, gap_tps))

    return Plan(
        entries=tuple(entries),
        status=status,
        relaxed=relaxed,
        solver=solver,
        method=method,
        formulation=formulation,
        cost_per_hour=cost,
        startup_cost=startup,
        objective=cost + startup - p.current_cost,
        solver_objective=objective,
        change_penalty=float(p.t_change @ np.abs(x - p.t_current)),
        bound=bound,
        gap=gap,
        solve_seconds=seconds,
        unserved=tuple(unserved),
        short_min=tuple(short),
        pools=_pool_use(p, x),
        at_max=tuple(at_max),
    )
