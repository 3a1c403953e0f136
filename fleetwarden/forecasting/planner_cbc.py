"""CBC through PuLP: the fallback solver, bundled with PuLP so it is always there.

PuLP reports `status == Optimal` even when CBC stopped at its time limit with an unproven
solution; what CBC actually proved is in `sol_status` (1 optimal within the gap, 2 integer
feasible only). `interpret` maps those honestly. PuLP does not expose CBC's best bound, so a CBC
plan's gap is only known to be within the requested gap when proven, and unknown otherwise.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import numpy as np
import pulp

from fleetwarden.forecasting.planner_mip import RunResult, RunStatus, SparseMip

_SOLUTION_OPTIMAL = 1
_SOLUTION_INTEGER_FEASIBLE = 2
_SOLUTION_INFEASIBLE = -1
_STATUS_INFEASIBLE = -1


def interpret(status: int, sol_status: int) -> RunStatus:
    """PuLP's (status, sol_status) as what was proven; status alone is not to be trusted."""
    if status == _STATUS_INFEASIBLE or sol_status == _SOLUTION_INFEASIBLE:
        return RunStatus.INFEASIBLE
    if sol_status == _SOLUTION_OPTIMAL:
        return RunStatus.OPTIMAL
    if sol_status == _SOLUTION_INTEGER_FEASIBLE:
        return RunStatus.FEASIBLE
    return RunStatus.NO_SOLUTION


def _bound(value: float) -> float | None:
    return None if math.isinf(value) else float(value)


def to_pulp(mip: SparseMip) -> tuple[Any, list[Any]]:
    """The program as a PuLP problem; variables are named by index so output maps back."""
    prob = pulp.LpProblem("fleetwarden_plan", pulp.LpMinimize)
    new = getattr(prob, "add_variable", None) or pulp.LpVariable  # PuLP >= 3.3 owns variables
    variables = [
        new(
            f"c{k}",
            lowBound=_bound(mip.col_lower[k]),
            upBound=_bound(mip.col_upper[k]),
            cat=pulp.LpInteger if mip.col_integer[k] else pulp.LpContinuous,
        )
        for k in range(mip.n_cols)
    ]
    objective = pulp.LpAffineExpression(
        [(variables[k], float(mip.col_cost[k])) for k in np.flatnonzero(mip.col_cost)],
        constant=float(mip.offset),
    )
    prob.setObjective(objective)
    for r in range(mip.n_rows):
        cols, vals = mip.row(r)
        expr = pulp.LpAffineExpression(
            [(variables[int(c)], float(v)) for c, v in zip(cols, vals, strict=True)]
        )
        lo, hi = float(mip.row_lower[r]), float(mip.row_upper[r])
        if lo == hi:
            prob += expr == lo, f"r{r}"
            continue
        if not math.isinf(lo):
            prob += expr >= lo, f"r{r}_lo"
        if not math.isinf(hi):
            prob += expr <= hi, f"r{r}_hi"
    return prob, variables


def solve_cbc(
    mip: SparseMip,
    time_limit: float,
    gap: float,
    abs_gap: float,
    threads: int,
    start: np.ndarray | None = None,
) -> RunResult:
    prob, variables = to_pulp(mip)
    if start is not None:
        for var, value in zip(variables, start, strict=True):
            var.setInitialValue(float(value))
    with warnings.catch_warnings():
        # PuLP 3.3 deprecates the bundled CBC in favour of a separately installed one; the
        # bundled binary is the point of this fallback, so keep using it while it ships.
        warnings.simplefilter("ignore", DeprecationWarning)
        solver = pulp.PULP_CBC_CMD(
            msg=False,
            timeLimit=max(1, math.ceil(time_limit)),
            gapRel=gap,
            gapAbs=abs_gap,
            threads=threads,
            warmStart=start is not None,
        )
    t0 = time.perf_counter()
    prob.solve(solver)
    seconds = time.perf_counter() - t0
    status = interpret(int(prob.status), int(prob.sol_status))
    if status in (RunStatus.INFEASIBLE, RunStatus.NO_SOLUTION):
        return RunResult(status, None, math.inf, -math.inf, seconds)
    values = np.array([v.varValue if v.varValue is not None else 0.0 for v in variables])
    return RunResult(status, values, mip.objective(values), -math.inf, seconds)
