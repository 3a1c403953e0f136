"""The hourly capacity plan: instances per model x region x GPU type (SageServe section 5).

`plan(spec, config)` returns a `Plan`: targets and deltas per (model, region, GPU type), the
hourly cost, what was proven about optimality, and what binds. It never raises for a forecast the
pools cannot hold: it then serves as much as fits (penalised unserved demand) and says which
(model, region) pairs go short and which pools are full. Only malformed input raises ValueError.

The default path (HiGHS, tight formulation), and why each step is there:

1. `build_tight` (planner_mip): integer instance counts with bounds from min/max and capacity.
2. LP relaxation plus rounds of MIR cuts (planner_cuts): a lower bound typically within 1% of
   the optimum, in about 0.1 s for 400 (model, region) pairs.
3. Rounding and local search on the LP solution (planner_heuristic): a plan typically within 1%
   of that bound; and the same local search from today's fleet (what overfills a shrunk pool
   or a lowered max stopped first, what falls short restarted). If the cheaper is within the
   configured gap, that is a proof and we are done.
4. Otherwise HiGHS branch and bound on the cut-strengthened model, warm-started from that plan,
   for what is left of the time limit (its own root cuts usually close the rest), and the same
   local search polishes its answer.
5. On every path: the answer replaces today's fleet only if strictly cheaper by the objective
   (start-up cost included); otherwise the plan keeps it (`method: keep-current`). The 1% gap
   is relative to the whole fleet's cost, so without this a re-plan of an unchanged forecast
   moved instances every hour for nothing.

The objective every step minimises includes the change penalty (`PlannerConfig.change_penalty`
times an instance's hourly cost per instance started or stopped; planner_mip.change_terms), so
among plans of (nearly) equal cost the one nearest today's fleet wins, on every path and solver:
without it, a forecast that moved by 2% moved an instance to another region to save half a cent
an hour (start-up cost 0, or just below the saving), and back when the forecast moved back.

See docs/planner.md for the formulation, what differs from the paper, and measurements.

Results are deterministic (single-threaded HiGHS, fixed seed, no randomness here) unless the time
limit cuts a step short, which the plan's status then says.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from fleetwarden.forecasting.planner_cbc import solve_cbc
from fleetwarden.forecasting.planner_heuristic import Heuristic, complete
from fleetwarden.forecasting.planner_mip import (
    Formulated,
    RunResult,
    RunStatus,
    SparseMip,
    build_naive,
    build_tight,
    feasible,
)
from fleetwarden.forecasting.planner_model import (
    FloatArray,
    Formulation,
    IntArray,
    ModelSpec,
    PlanInput,
    PlannerConfig,
    PoolSpec,
    Problem,
    RegionBounds,
    SolverName,
    compile_problem,
)
from fleetwarden.forecasting.planner_report import Plan, make_plan

try:  # a hard dependency, but a broken wheel must not take the CBC fallback down with it
    from fleetwarden.forecasting import planner_highs
except ImportError:  # pragma: no cover - exercised only on broken installs
    planner_highs = None  # type: ignore[assignment]

__all__ = [
    "Formulation",
    "ModelSpec",
    "Plan",
    "PlanInput",
    "PlannerConfig",
    "PoolSpec",
    "RegionBounds",
    "RunStatus",
    "SolverName",
    "plan",
]

_INFEASIBLE = RunResult(RunStatus.INFEASIBLE, None, math.inf, math.inf, 0.0)
_STRICTLY = 1e-9
"""A plan must beat staying by this share of its cost: float noise is not a reason to move."""


@dataclass(frozen=True)
class _Outcome:
    form: Formulated
    run: RunResult
    bound: float
    method: str
    solver: SolverName


def relative_gap(objective: float, bound: float) -> float:
    """(objective - bound) / |objective|, HiGHS's definition; inf without a bound."""
    if not math.isfinite(bound) or not math.isfinite(objective):
        return math.inf
    return max(0.0, objective - bound) / max(abs(objective), 1e-9)


def _proven(cfg: PlannerConfig, objective: float, bound: float) -> bool:
    within = relative_gap(objective, bound) <= cfg.mip_rel_gap
    return within or objective - bound <= cfg.mip_abs_gap


def _staying(p: Problem, form: Formulated, mip: SparseMip) -> RunResult | None:
    """The plan that keeps every current count, if `mip` allows it; None otherwise.

    Why it is a candidate of its own: the gap is relative to the whole fleet's hourly cost, so a
    plan "within 1%" of the bound may cost more than changing nothing, and each round's solver
    answer is a different such plan. Re-planned every hour on an unchanged forecast, the fleet
    then moved tens of instances a round for nothing (some started one round, stopped the next),
    each move paying start-up cost, while every plan claimed to be optimal.
    """
    values = _vector(p, form, p.t_current)
    if not feasible(mip, values):
        return None
    objective = mip.objective(values)
    return RunResult(RunStatus.FEASIBLE, values, objective, -math.inf, 0.0)


def _vector(p: Problem, form: Formulated, x: IntArray) -> FloatArray:
    """The column vector of either formulation for instance counts x."""
    if not form.naive:
        return complete(p, form, x)
    values = np.zeros(form.mip.n_cols)
    delta = x - p.t_current
    values[form.x_cols] = delta
    values[form.u_cols] = np.maximum(delta, 0)
    return values


def _settle(
    cfg: PlannerConfig,
    stay: RunResult | None,
    form: Formulated,
    run: RunResult,
    bound: float,
    method: str,
    solver: SolverName = SolverName.HIGHS,
) -> _Outcome:
    """The solved plan if strictly cheaper than staying, by the same objective; else staying.

    The objective includes the change penalty, which staying does not pay: a plan that moves
    instances must save more than they are charged.

    Staying then carries the status of what is proven about it: optimal when the solver proved
    its own answer within the gap (staying costs no more, so it is within the gap too) or when
    staying is within the gap of the best bound; feasible otherwise. Method `keep-current`.
    """
    if stay is None or (
        run.values is not None
        and run.objective < stay.objective - _STRICTLY * max(1.0, abs(stay.objective))
    ):
        return _Outcome(form, run, bound, method, solver)
    proven = run.status == RunStatus.OPTIMAL and run.values is not None
    proven = proven or (math.isfinite(bound) and _proven(cfg, stay.objective, bound))
    status = RunStatus.OPTIMAL if proven else RunStatus.FEASIBLE
    kept = RunResult(status, stay.values, stay.objective, run.bound, run.seconds)
    return _Outcome(form, kept, bound, "keep-current", solver)


def _polish(p: Problem, form: Formulated, heuristic: Heuristic, run: RunResult) -> RunResult:
    """Local search from the solver's plan; keeps it only if strictly cheaper and feasible.

    Branch and bound stops within the gap, which may leave, say, one instance that would fit and
    serve demand in the relaxed problem; the local search's moves include every such instance,
    so a polished plan never leaves servable demand an instance it could start.
    """
    if run.values is None:
        return run
    x = heuristic.improve(form.instances(p, run.values))
    values = _vector(p, form, x)
    objective = form.mip.objective(values)
    if objective < run.objective - 1e-9 * max(1.0, abs(run.objective)) and feasible(
        form.mip, values
    ):
        return RunResult(run.status, values, objective, run.bound, run.seconds)
    return run


def _candidate(
    cfg: PlannerConfig, mip: SparseMip, values: FloatArray, bound: float
) -> RunResult | None:
    """A plan to beat, if it is feasible; optimal when within the gap of the LP bound."""
    if not feasible(mip, values):
        return None
    objective = mip.objective(values)
    status = RunStatus.OPTIMAL if _proven(cfg, objective, bound) else RunStatus.FEASIBLE
    return RunResult(status, values, objective, bound, 0.0)


def _cheapest(*runs: RunResult | None) -> RunResult | None:
    found = [r for r in runs if r is not None]
    return min(found, key=lambda r: r.objective) if found else None


def _highs_tight(p: Problem, cfg: PlannerConfig, relaxed: bool, deadline: float) -> _Outcome:
    """LP with cuts, heuristic plans, and branch and bound only if they are not proven.

    Two heuristic plans compete: the LP rounded and searched, and the current fleet searched
    (`Heuristic.near_current`: fitted to the pools and repaired first, so also when today's
    fleet is not a plan). The second costs one local search from a plan that is usually near a
    local optimum already, and is what keeps a fleet whose forecast has not changed where it is:
    both plans are priced by the same objective, start-up cost included.
    """
    form = build_tight(p, relaxed=relaxed, penalty_factor=cfg.penalty_factor)
    if np.any(form.mip.col_lower > form.mip.col_upper):  # a min no pool can ever hold
        return _Outcome(form, _INFEASIBLE, math.inf, "bounds", SolverName.HIGHS)
    left = deadline - time.perf_counter()
    lp = planner_highs.relax_with_cuts(form, cfg.cut_rounds, left, cfg.threads, deadline)
    if not lp.feasible:
        return _Outcome(form, _INFEASIBLE, math.inf, "lp", SolverName.HIGHS)
    stay = _staying(p, form, lp.mip)
    incumbent: RunResult | None = None
    heuristic = Heuristic(p, form, cfg.penalty_factor, stop=lambda: time.perf_counter() >= deadline)
    if lp.values is not None and time.perf_counter() < deadline:
        rounded = _candidate(cfg, lp.mip, complete(p, form, heuristic.run(lp.values)), lp.bound)
        near = None
        if time.perf_counter() < deadline:  # also when today's fleet falls short
            searched = complete(p, form, heuristic.near_current())
            near = _candidate(cfg, lp.mip, searched, lp.bound)
        incumbent = _cheapest(near, rounded)  # the plan near today's fleet wins a tie
        if incumbent is not None and incumbent.status == RunStatus.OPTIMAL:
            return _settle(cfg, stay, form, incumbent, lp.bound, "lp-bound+heuristic")
    incumbent = _cheapest(incumbent, stay)
    left = deadline - time.perf_counter()
    if left <= 0:
        run = incumbent or RunResult(RunStatus.NO_SOLUTION, None, math.inf, lp.bound, 0.0)
        return _settle(cfg, stay, form, run, lp.bound, "lp-bound+heuristic")
    start = None if incumbent is None else incumbent.values
    run = planner_highs.solve_mip(
        lp.mip, left, cfg.mip_rel_gap, cfg.mip_abs_gap, cfg.threads, start
    )
    if run.values is None and incumbent is not None and run.status != RunStatus.INFEASIBLE:
        run = incumbent  # HiGHS ran out of time before even reloading the start
    run = _polish(p, form, heuristic, run)
    return _settle(cfg, stay, form, run, max(run.bound, lp.bound), "branch-and-bound")


def _direct(
    p: Problem, cfg: PlannerConfig, solver: SolverName, relaxed: bool, deadline: float
) -> _Outcome:
    """One solver call on a formulation as built: the naive path, and the CBC fallback.

    The solver's starting incumbent (HiGHS `setSolution`, CBC's warm start) is the plan the
    local search finds from today's fleet (`Heuristic.near_current`), or today's fleet itself if
    that is feasible and no dearer; the answer is kept only if strictly cheaper than staying (see
    `_settle`). Why the search: a solver stops at any plan within the gap of its bound, and the
    gap is relative to the whole fleet's cost, so a plan 1% above the best one near today's
    fleet passes, however many instances it moves; the change penalty is far below that gap and
    decides nothing unless the start already holds the plan near today's fleet. The answer is
    polished by the same local search, as on the tight path (`_polish`): a solver's plan within
    the gap may still have a move that pays, and the next round's search from it made that move
    instead of keeping an unchanged fleet.
    """
    if cfg.formulation == Formulation.NAIVE:
        form = build_naive(p)
    else:
        form = build_tight(p, relaxed=relaxed, penalty_factor=cfg.penalty_factor)
    stay = None
    if np.any(form.mip.col_lower > form.mip.col_upper):
        run = _INFEASIBLE
    else:
        heuristic = Heuristic(
            p, form, cfg.penalty_factor, stop=lambda: time.perf_counter() >= deadline
        )
        stay = _staying(p, form, form.mip)
        near = _cheapest(stay, _near(p, form, heuristic, deadline))  # staying wins a tie
        start = None if near is None else near.values
        left = max(deadline - time.perf_counter(), 1e-3)
        gaps = (cfg.mip_rel_gap, cfg.mip_abs_gap, cfg.threads)
        if solver == SolverName.HIGHS:
            run = planner_highs.solve_mip(form.mip, left, *gaps, start)
        else:
            run = solve_cbc(form.mip, left, *gaps, start)
        if run.values is None and near is not None and run.status != RunStatus.INFEASIBLE:
            run = near  # stopped before reporting even the start it was given
        run = _polish(p, form, heuristic, run)
    return _settle(cfg, stay, form, run, run.bound, "branch-and-bound", solver)


def _near(p: Problem, form: Formulated, heuristic: Heuristic, deadline: float) -> RunResult | None:
    """The local search's plan near today's fleet, if feasible: the direct paths' incumbent.

    It always fits the pools and maxima (`Heuristic.near_current` stops what overfills them);
    it is not a plan only when the repair found no room for a demand or min it left short."""
    if time.perf_counter() >= deadline:
        return None
    values = _vector(p, form, heuristic.near_current())
    if not feasible(form.mip, values):
        return None
    return RunResult(RunStatus.FEASIBLE, values, form.mip.objective(values), -math.inf, 0.0)


def _nothing_to_decide(p: Problem, form: Formulated, solver: SolverName) -> _Outcome:
    """No model may run anywhere: the only plan is none, feasible iff no demand or min exists."""
    none = np.zeros(0, dtype=np.int64)
    values = np.zeros(form.mip.n_cols) if form.naive else complete(p, form, none)
    if not feasible(form.mip, values):
        return _Outcome(form, _INFEASIBLE, math.inf, "trivial", solver)
    objective = form.mip.objective(values)
    run = RunResult(RunStatus.OPTIMAL, values, objective, objective, 0.0)
    return _Outcome(form, run, objective, "trivial", solver)


def _solve(p: Problem, cfg: PlannerConfig, solver: SolverName, deadline: float) -> _Outcome:
    """The strict problem first; if it is infeasible, the relaxed one (the naive model has none)."""
    if solver == SolverName.HIGHS and planner_highs is None:
        raise ImportError("highspy is not importable")
    outcome = None
    for relaxed in (False, True):
        if p.n_triples == 0:
            naive = cfg.formulation == Formulation.NAIVE
            form = build_naive(p) if naive else build_tight(p, relaxed, cfg.penalty_factor)
            outcome = _nothing_to_decide(p, form, solver)
        elif solver == SolverName.HIGHS and cfg.formulation == Formulation.TIGHT:
            outcome = _highs_tight(p, cfg, relaxed, deadline)
        else:
            outcome = _direct(p, cfg, solver, relaxed, deadline)
        if outcome.run.status != RunStatus.INFEASIBLE or cfg.formulation == Formulation.NAIVE:
            return outcome
    assert outcome is not None
    return outcome


def plan(spec: PlanInput, config: PlannerConfig | None = None) -> Plan:
    """Plan the next hour. Raises ValueError only for malformed input (see compile_problem)."""
    cfg = config or PlannerConfig()
    started = time.perf_counter()
    deadline = started + cfg.time_limit_seconds
    p = compile_problem(spec, cfg.change_penalty)
    solver = cfg.solver
    try:
        outcome = _solve(p, cfg, solver, deadline)
    except (RuntimeError, ImportError):  # HiGHS missing or broken: CBC comes with PuLP
        if solver != SolverName.HIGHS or not cfg.fallback:
            raise
        solver = SolverName.CBC
        outcome = _solve(p, cfg, solver, deadline)
    run = outcome.run
    counts = None if run.values is None else outcome.form.instances(p, run.values)
    gap: float | None = None
    if run.values is not None:
        if math.isfinite(outcome.bound):
            gap = relative_gap(run.objective, outcome.bound)
        elif run.status == RunStatus.OPTIMAL:
            gap = cfg.mip_rel_gap  # what CBC proved; PuLP does not expose its bound
    return make_plan(
        p,
        counts,
        status=run.status,
        relaxed=outcome.form.relaxed,
        solver=outcome.solver.value,
        method=outcome.method,
        formulation=cfg.formulation.value,
        objective=run.objective,
        bound=outcome.bound if math.isfinite(outcome.bound) else None,
        gap=gap,
        seconds=time.perf_counter() - started,
    )
