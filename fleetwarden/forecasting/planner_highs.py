"""HiGHS through `highspy` directly: the LP relaxation with its cut loop, and the full MIP.

PuLP would build the same program through Python objects per term, which for 10,000 columns costs
more than HiGHS takes to solve it; handing HiGHS the sparse arrays costs nothing. Every call gets a
fresh `Highs` so options and state never leak between rounds; results are plain data.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np

from fleetwarden.forecasting.planner_cuts import MirSeparator
from fleetwarden.forecasting.planner_mip import Formulated, RunResult, RunStatus, SparseMip
from fleetwarden.forecasting.planner_model import FloatArray

INF = highspy.kHighsInf
_ROWWISE = 2
_MINIMIZE = 1


def _clip(a: FloatArray) -> FloatArray:
    return np.clip(a, -INF, INF)


def new_highs(time_limit: float, gap: float, abs_gap: float, threads: int) -> Any:
    """A silent solver; `threads=1` keeps results reproducible run to run."""
    h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", max(float(time_limit), 1e-3))
    h.setOptionValue("mip_rel_gap", float(gap))
    h.setOptionValue("mip_abs_gap", float(abs_gap))
    h.setOptionValue("threads", int(threads))
    h.setOptionValue("random_seed", 0)
    return h


def _run(h: Any) -> None:
    """Run; a HiGHS error (not a time limit, which is a warning) becomes an exception."""
    if h.run() == highspy.HighsStatus.kError:
        raise RuntimeError(f"HiGHS failed: {h.modelStatusToString(h.getModelStatus())}")


def pass_model(h: Any, mip: SparseMip, integer: bool) -> None:
    kinds = mip.col_integer.astype(np.int32) if integer else np.zeros(mip.n_cols, np.int32)
    status = h.passModel(
        mip.n_cols,
        mip.n_rows,
        int(mip.row_cols.size),
        _ROWWISE,
        _MINIMIZE,
        float(mip.offset),
        mip.col_cost,
        _clip(mip.col_lower),
        _clip(mip.col_upper),
        _clip(mip.row_lower),
        _clip(mip.row_upper),
        mip.row_start[:-1].astype(np.int32),
        mip.row_cols.astype(np.int32),
        mip.row_vals,
        kinds,
    )
    if status == highspy.HighsStatus.kError:
        raise RuntimeError("HiGHS rejected the model")


@dataclass(frozen=True)
class Relaxation:
    """The LP relaxation after the cut loop: a lower bound and a fractional plan to round."""

    feasible: bool
    bound: float
    values: FloatArray | None
    mip: SparseMip
    """The formulation with the cuts that were added, ready for branch and bound."""
    cuts: int
    seconds: float


def relax_with_cuts(
    form: Formulated, rounds: int, time_limit: float, threads: int, deadline: float
) -> Relaxation:
    """Solve the LP, add violated MIR cuts of the covering rows, re-solve warm; repeat.

    Stops when no cut is violated, the bound moves by less than 1e-5 relative, or time is up.
    """
    start = time.perf_counter()
    h = new_highs(time_limit, 0.0, 0.0, threads)
    pass_model(h, form.mip, integer=False)
    _run(h)
    mip = form.mip
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        feasible = h.getModelStatus() not in (
            highspy.HighsModelStatus.kInfeasible,
            highspy.HighsModelStatus.kUnboundedOrInfeasible,
        )
        return Relaxation(feasible, -INF, None, mip, 0, time.perf_counter() - start)
    values = np.array(h.getSolution().col_value)
    bound = float(h.getInfo().objective_function_value)
    added = 0
    separator = MirSeparator(mip, form.cover_rows, form.pack_rows)
    for _ in range(rounds):
        if time.perf_counter() >= deadline:
            break
        cuts = separator.separate(values)
        if not cuts:
            break
        mip = mip.with_rows(cuts)
        added += len(cuts)
        lengths = np.array([c.cols.size for c in cuts])
        h.addRows(
            len(cuts),
            np.array([c.lower for c in cuts]),
            np.full(len(cuts), INF),
            int(lengths.sum()),
            np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32),
            np.concatenate([c.cols for c in cuts]).astype(np.int32),
            np.concatenate([c.vals for c in cuts]),
        )
        _run(h)
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            break  # keep the last optimal values and bound (cuts are valid, so this is rare)
        values = np.array(h.getSolution().col_value)
        previous, bound = bound, float(h.getInfo().objective_function_value)
        if bound - previous <= 1e-5 * max(1.0, abs(bound)):
            break
    return Relaxation(True, bound, values, mip, added, time.perf_counter() - start)


def solve_mip(
    mip: SparseMip,
    time_limit: float,
    gap: float,
    abs_gap: float,
    threads: int,
    start: FloatArray | None = None,
) -> RunResult:
    """Branch and bound; `start` is an incumbent to beat. Status follows what HiGHS proved."""
    h = new_highs(time_limit, gap, abs_gap, threads)
    pass_model(h, mip, integer=True)
    if start is not None:
        h.setSolution(mip.n_cols, np.arange(mip.n_cols, dtype=np.int32), start)
    t0 = time.perf_counter()
    _run(h)
    seconds = time.perf_counter() - t0
    info = h.getInfo()
    model_status = h.getModelStatus()
    has_solution = int(info.primal_solution_status) == 2
    # Costs are never negative and every column is bounded below, so "unbounded or
    # infeasible" can only mean infeasible.
    if model_status in (
        highspy.HighsModelStatus.kInfeasible,
        highspy.HighsModelStatus.kUnboundedOrInfeasible,
    ):
        return RunResult(RunStatus.INFEASIBLE, None, INF, INF, seconds)
    if not has_solution:
        return RunResult(RunStatus.NO_SOLUTION, None, INF, float(info.mip_dual_bound), seconds)
    values = np.array(h.getSolution().col_value)
    objective = float(info.objective_function_value)
    bound = float(info.mip_dual_bound)
    proven = model_status == highspy.HighsModelStatus.kOptimal
    status = RunStatus.OPTIMAL if proven else RunStatus.FEASIBLE
    return RunResult(status, values, objective, bound, seconds)
