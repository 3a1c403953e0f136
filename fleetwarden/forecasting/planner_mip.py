"""The planner's integer programs as solver-neutral sparse matrices, and the cuts that tighten them.

Two formulations of SageServe section 5 over the same triples (model, pool):

* `build_naive`: the paper as written. Integer delta >= -n per triple, integer z >= delta standing
  for max(0, delta), demand, min/max and capacity rows in raw units. Kept so tests can check that
  the tight model optimises the same thing, and so the benchmark can show the difference.
* `build_tight`: integer instance counts x = n + delta with bounds taken from min/max and pool
  capacity (so rows that are mere bounds disappear), a continuous u >= x - n for the positive part
  (integral at any optimum, so it needs no integrality), demand rows scaled to instances of the
  model's fastest GPU, the per-model row dropped when epsilon = 1 (then implied), and rows that can
  never bind dropped. `relaxed=True` adds penalised slack to demand and min rows, for forecasts the
  pools cannot hold.

`planner_cuts` adds mixed-integer rounding cuts for the covering rows; added to the LP
relaxation they close most of its gap to the integer optimum (each model/region needs whole
instances, and the LP otherwise buys fractions of them).

Objective of both: hourly cost of the planned fleet plus start-up cost of new instances. It differs
from the paper's (change in cost) by the constant cost of the current fleet: same optimum, but the
relative gap is measured against a cost that is never near zero.

Plus the change penalty lambda = `change_penalty` x c per instance started or stopped, so that a
plan moves instances only for a saving larger than that (`change_terms`). It takes no extra
column or row: with u = max(0, x - n), |x - n| = 2u - (x - n), so lambda |x - n| is lambda off
x's cost, 2 lambda on u's and the constant lambda n (the naive model's z plays u's part).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum

import numpy as np

from fleetwarden.forecasting.planner_model import FloatArray, IntArray, Problem

INF = math.inf


class RunStatus(StrEnum):
    OPTIMAL = "optimal"
    """Solved to within the requested gap (proven)."""
    FEASIBLE = "feasible"
    """A solution, but the gap is not proven (time limit)."""
    INFEASIBLE = "infeasible"
    NO_SOLUTION = "no_solution"
    """Stopped (time limit, error) before finding any solution."""


@dataclass(frozen=True)
class RunResult:
    status: RunStatus
    values: FloatArray | None
    objective: float
    bound: float
    seconds: float


@dataclass(frozen=True)
class SparseMip:
    """min cost.x + offset s.t. row_lower <= A x <= row_upper, col bounds, some columns integer.

    Rows are stored compressed (CSR), the layout HiGHS takes without conversion.
    """

    col_lower: FloatArray
    col_upper: FloatArray
    col_cost: FloatArray
    col_integer: np.ndarray
    row_lower: FloatArray
    row_upper: FloatArray
    row_start: IntArray
    row_cols: IntArray
    row_vals: FloatArray
    offset: float = 0.0

    @property
    def n_cols(self) -> int:
        return int(self.col_lower.size)

    @property
    def n_rows(self) -> int:
        return int(self.row_lower.size)

    def row(self, r: int) -> tuple[IntArray, FloatArray]:
        lo, hi = self.row_start[r], self.row_start[r + 1]
        return self.row_cols[lo:hi], self.row_vals[lo:hi]

    def activity(self, x: FloatArray) -> FloatArray:
        """A x, for checking a solution against the rows."""
        rows = np.repeat(np.arange(self.n_rows), np.diff(self.row_start))
        weights = self.row_vals * x[self.row_cols]
        return np.bincount(rows, weights=weights, minlength=self.n_rows).astype(np.float64)

    def objective(self, x: FloatArray) -> float:
        return float(self.col_cost @ x) + self.offset

    def with_rows(self, rows: list[Row]) -> SparseMip:
        """The same program with rows appended (cuts)."""
        if not rows:
            return self
        lengths = np.array([r.cols.size for r in rows], dtype=np.int64)
        return replace(
            self,
            row_lower=np.concatenate([self.row_lower, [r.lower for r in rows]]),
            row_upper=np.concatenate([self.row_upper, [r.upper for r in rows]]),
            row_start=np.concatenate([self.row_start, self.row_start[-1] + np.cumsum(lengths)]),
            row_cols=np.concatenate([self.row_cols, *[r.cols for r in rows]]),
            row_vals=np.concatenate([self.row_vals, *[r.vals for r in rows]]),
        )


@dataclass(frozen=True)
class Row:
    cols: IntArray
    vals: FloatArray
    lower: float
    upper: float


@dataclass
class _Builder:
    """Accumulates columns and rows; `build` sorts nothing and copies once."""

    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)

    def col(self, lower: float, upper: float, cost: float, integer: bool) -> int:
        self.lower.append(lower)
        self.upper.append(upper)
        self.cost.append(cost)
        self.integer.append(integer)
        return len(self.lower) - 1

    def row(self, terms: list[tuple[int, float]], lower: float, upper: float) -> int:
        cols = np.array([c for c, _ in terms], dtype=np.int64)
        vals = np.array([v for _, v in terms], dtype=np.float64)
        self.rows.append(Row(cols, vals, lower, upper))
        return len(self.rows) - 1

    def build(self, offset: float = 0.0) -> SparseMip:
        empty = SparseMip(
            col_lower=np.array(self.lower, dtype=np.float64),
            col_upper=np.array(self.upper, dtype=np.float64),
            col_cost=np.array(self.cost, dtype=np.float64),
            col_integer=np.array(self.integer, dtype=bool),
            row_lower=np.zeros(0),
            row_upper=np.zeros(0),
            row_start=np.zeros(1, dtype=np.int64),
            row_cols=np.zeros(0, dtype=np.int64),
            row_vals=np.zeros(0),
            offset=offset,
        )
        return empty.with_rows(self.rows)


@dataclass(frozen=True)
class Formulated:
    """A built program plus where each planner quantity lives in it."""

    mip: SparseMip
    x_cols: IntArray
    """Column of the instance count (tight) or delta (naive) of every triple."""
    u_cols: IntArray
    """Column of max(0, delta) per triple, -1 when the tight model needs none."""
    naive: bool
    relaxed: bool
    cover_rows: IntArray
    """Rows of the form sum a x (+ slack) >= b, x >= 0 integer: where MIR cuts apply."""
    pack_rows: IntArray
    """Pool rows sum g x <= C: MIR cuts apply to them too."""
    region_slack: IntArray
    """Per (model, region) pair: column of unserved demand (instances of the fastest GPU), -1."""
    model_slack: IntArray
    min_slack: IntArray

    def instances(self, problem: Problem, values: FloatArray) -> IntArray:
        """Instances per triple from a solution vector."""
        x = np.rint(values[self.x_cols]).astype(np.int64)
        return x + problem.t_current if self.naive else x


def _pools_rows(b: _Builder, p: Problem, x_of: IntArray, shift: IntArray | None) -> list[int]:
    """Capacity per pool in GPUs and in instances; rows that cannot bind are left out."""
    rows = []
    g = p.model_gpus[p.t_model]
    for q in range(p.pool_gpus.size):
        members = np.flatnonzero(p.t_pool == q)
        if members.size == 0:
            continue
        for cap, weight in ((p.pool_gpus[q], g[members]), (p.pool_instances[q], None)):
            if cap < 0:
                continue
            w = np.ones(members.size) if weight is None else weight.astype(np.float64)
            if shift is None:
                if float(w @ p.t_upper[members]) <= cap:
                    continue
                rows.append(b.row(list(zip(x_of[members], w, strict=True)), -INF, float(cap)))
            else:
                used = float(w @ shift[members])
                rows.append(b.row(list(zip(x_of[members], w, strict=True)), -INF, cap - used))
    return rows


def penalties(p: Problem, factor: float) -> tuple[FloatArray, float]:
    """Cost per unserved instance-equivalent per model, and per missing min instance.

    An instance-equivalent is theta_max tokens/s; the penalty is `factor` times the dearest way
    to serve one, so the solver always prefers serving demand it has room for (up to 1/factor of
    an instance, the price of keeping the numbers sane).
    """
    per_model = np.ones(p.n_models)
    ratio = (p.t_cost + p.t_sigma) * p.model_theta_max[p.t_model] / p.t_theta
    np.maximum.at(per_model, p.t_model, ratio)
    per_model *= factor
    return per_model, 10.0 * float(per_model.max(initial=factor))


def cover_needs(p: Problem) -> tuple[FloatArray, FloatArray]:
    """Right-hand sides of the demand rows per (model, region) pair and per model, in instances.

    Demand in tokens/s over the model's fastest throughput, except that a positive need below
    what one instance of the slowest GPU type there serves is raised to that: a positive demand
    needs at least one instance of some type, and any one instance covers it, so the integer
    plans meeting the row are the same. Why: HiGHS accepts a row violated by up to its
    feasibility tolerance (1e-7, absolute), so 0.001 tokens/s at 5,000 tokens/s per instance
    (2e-7 of an instance) was "served" by no instance at all, status optimal. A need of at least
    one slow instance's share can never be met within tolerance by zero instances.
    """
    scale = p.t_theta / p.model_theta_max[p.t_model]
    pair_floor = np.full(p.mr_model.size, np.inf)
    np.minimum.at(pair_floor, p.t_pair, scale)
    model_floor = np.full(p.n_models, np.inf)
    np.minimum.at(model_floor, p.t_model, scale)
    pair_floor[~np.isfinite(pair_floor)] = 0.0  # no triple: the row is all slack (or infeasible)
    model_floor[~np.isfinite(model_floor)] = 0.0
    pair_need = p.mr_demand / p.model_theta_max[p.mr_model]
    model_need = p.model_total / p.model_theta_max
    pair_result: FloatArray = np.where(pair_need > 0, np.maximum(pair_need, pair_floor), 0.0)
    model_result: FloatArray = np.where(model_need > 0, np.maximum(model_need, model_floor), 0.0)
    return pair_result, model_result


def change_terms(p: Problem) -> tuple[FloatArray, FloatArray]:
    """Column costs of x (or delta) and of u = max(0, x - n): cost, start-up and change penalty.

    Why the penalty: the paper's objective charges start-up cost only, so two plans of equal or
    nearly equal cost are equally good to it, and the solver picks either; re-planned every hour
    on a forecast that moved by 2%, an instance moved to another region to save half a cent an
    hour, and back the next hour. With lambda per instance started or stopped, |x - n| is
    2 max(0, x - n) - (x - n), so the penalty is lambda off x's cost and 2 lambda on u's, plus
    the constant lambda n (`change_offset`). lambda < c keeps x's cost >= 0.
    """
    x_cost: FloatArray = p.t_cost - p.t_change
    u_cost: FloatArray = p.t_sigma + 2.0 * p.t_change
    return x_cost, u_cost


def change_offset(p: Problem) -> float:
    """lambda . n: with it, the objective is exactly cost + start-up + lambda |x - n|."""
    return float(p.t_change @ p.t_current)


def build_tight(p: Problem, relaxed: bool = False, penalty_factor: float = 1000.0) -> Formulated:
    b = _Builder()
    x_cost, u_cost = change_terms(p)
    upper = np.maximum(p.t_upper, 0)
    lower = np.zeros(p.n_triples, dtype=np.int64)
    members: list[list[int]] = [[] for _ in range(p.mr_model.size)]
    for t, k in enumerate(p.t_pair.tolist()):
        members[k].append(t)
    if not relaxed:  # a (model, region) served by one pool: min/max are just its bounds
        for k, ts in enumerate(members):
            if len(ts) == 1:
                lower[ts[0]] = p.mr_min[k]
    x = np.array(
        [
            b.col(float(lower[t]), float(upper[t]), float(x_cost[t]), True)
            for t in range(p.n_triples)
        ],
        dtype=np.int64,
    )
    u_cols = np.full(p.n_triples, -1, dtype=np.int64)
    for t in range(p.n_triples):
        n = int(p.t_current[t])
        if u_cost[t] > 0 and upper[t] > n:  # else u's cost is 0, or x <= n and u = 0 anyway
            u_cols[t] = b.col(0.0, float(upper[t] - n), float(u_cost[t]), False)
            b.row([(int(u_cols[t]), 1.0), (int(x[t]), -1.0)], float(-n), INF)

    penalty, min_penalty = penalties(p, penalty_factor)
    scale = p.t_theta / p.model_theta_max[p.t_model]
    pair_need, model_need = cover_needs(p)
    covers: list[int] = []
    region_slack = np.full(p.mr_model.size, -1, dtype=np.int64)
    min_slack = np.full(p.mr_model.size, -1, dtype=np.int64)
    for k, ts in enumerate(members):
        i = int(p.mr_model[k])
        terms = [(int(x[t]), float(scale[t])) for t in ts]
        need = float(pair_need[k])
        if need > 0:
            if relaxed:
                region_slack[k] = b.col(0.0, need, float(penalty[i]), False)
                terms_s = [*terms, (int(region_slack[k]), 1.0)]
                covers.append(b.row(terms_s, need, INF))
            else:
                covers.append(b.row(terms, need, INF))
        count = [(c, 1.0) for c, _ in terms]
        lo, hi = int(p.mr_min[k]), int(p.mr_max[k])
        if lo > 0 and (relaxed or len(ts) != 1):
            if relaxed:
                min_slack[k] = b.col(0.0, float(lo), min_penalty, False)
                count_s = [*count, (int(min_slack[k]), 1.0)]
                b.row(count_s, float(lo), INF)
            else:
                b.row(count, float(lo), INF)
        if len(ts) > 1 and int(upper[ts].sum()) > hi:
            b.row(count, -INF, float(hi))

    model_slack = np.full(p.n_models, -1, dtype=np.int64)
    for i, m in enumerate(p.spec.models):
        need = float(model_need[i])
        if m.epsilon >= 1.0 or need <= 0:
            continue  # implied by the region rows
        terms = [(int(x[t]), float(scale[t])) for t in p.triples_of_model(i)]
        if relaxed:
            model_slack[i] = b.col(0.0, need, float(penalty[i]), False)
            terms.append((int(model_slack[i]), 1.0))
        covers.append(b.row(terms, need, INF))
    packs = _pools_rows(b, p, x, None)
    return Formulated(
        mip=b.build(offset=change_offset(p)),
        x_cols=x,
        u_cols=u_cols,
        naive=False,
        relaxed=relaxed,
        cover_rows=np.array(covers, dtype=np.int64),
        pack_rows=np.array(packs, dtype=np.int64),
        region_slack=region_slack,
        model_slack=model_slack,
        min_slack=min_slack,
    )


def build_naive(p: Problem) -> Formulated:
    """SageServe section 5 verbatim (all integer), plus the same change penalty as the tight
    model (`change_terms`: |delta| = 2 z - delta); infeasible input stays infeasible."""
    b = _Builder()
    n = p.t_current
    d_cost, z_cost = change_terms(p)
    d = np.array(
        [b.col(float(-n[t]), INF, float(d_cost[t]), True) for t in range(p.n_triples)],
        dtype=np.int64,
    )
    z = np.full(p.n_triples, -1, dtype=np.int64)
    for t in range(p.n_triples):
        z[t] = b.col(0.0, INF, float(z_cost[t]), True)
        b.row([(int(z[t]), 1.0), (int(d[t]), -1.0)], 0.0, INF)
    served_now = p.t_theta * n
    for k in range(p.mr_model.size):
        i = int(p.mr_model[k])
        ts = np.flatnonzero(p.t_pair == k)
        terms = [(int(d[t]), float(p.t_theta[t])) for t in ts]
        b.row(terms, float(p.mr_demand[k] - served_now[ts].sum()), INF)
        now = float(n[ts].sum())
        count = [(int(d[t]), 1.0) for t in ts]
        b.row(count, float(p.mr_min[k]) - now, float(p.mr_max[k]) - now)
    for i in range(p.n_models):
        ts = p.triples_of_model(i)
        terms = [(int(d[t]), float(p.t_theta[t])) for t in ts]
        b.row(terms, float(p.model_total[i] - served_now[ts].sum()), INF)
    _pools_rows(b, p, d, n)
    none = np.full(p.mr_model.size, -1, dtype=np.int64)
    return Formulated(
        mip=b.build(offset=float(p.t_cost @ n)),
        x_cols=d,
        u_cols=z,
        naive=True,
        relaxed=False,
        cover_rows=np.zeros(0, dtype=np.int64),
        pack_rows=np.zeros(0, dtype=np.int64),
        region_slack=none,
        model_slack=np.full(p.n_models, -1, dtype=np.int64),
        min_slack=none,
    )


def feasible(mip: SparseMip, x: FloatArray, tol: float = 1e-6) -> bool:
    """Every bound, row and integrality holds (within tol): checked before a plan is trusted."""
    activity = mip.activity(x)
    scale = np.maximum(1.0, np.abs(mip.row_lower[np.isfinite(mip.row_lower)]))
    rows_low = np.all(
        activity[np.isfinite(mip.row_lower)]
        >= mip.row_lower[np.isfinite(mip.row_lower)] - tol * scale
    )
    rows_high = np.all(activity <= mip.row_upper + tol * np.maximum(1.0, np.abs(mip.row_upper)))
    cols = np.all(x >= mip.col_lower - tol) and np.all(x <= mip.col_upper + tol)
    ints = x[mip.col_integer]
    integral = np.all(np.abs(ints - np.rint(ints)) <= tol)
    return bool(rows_low and rows_high and cols and integral)
