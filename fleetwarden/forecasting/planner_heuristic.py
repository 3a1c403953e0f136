"""A fast primal heuristic: round the LP down, repair greedily, then improve by local search.

Why not just let the MIP solver find plans: on 1,000 (model, region) pairs HiGHS spends seconds
in its root heuristics before its first plan within 1% of the bound, while the plan it needs is
mostly the LP solution with each region's fractional instances settled. This does exactly that,
on the planner's own arrays, in a few hundred milliseconds:

1. Round the LP instance counts down (keeps every pool within capacity), then round up the
   largest fractional parts while pools have room.
2. Repair: add the cheapest instances that restore min counts, then each region's demand, then
   each model's total, where pools and max counts leave room. Then drop what no row needs.
3. Pair moves: for each (model, region), try every count vector in a small box around the
   current one and every "transfer" of instances from one GPU type to another (see `_moves`),
   all at once as one array, and keep the cheapest, everything else fixed.
4. Exchange moves: in a full pool, one model gives up an instance (moving to its next best
   option) so that another model gains more than that costs.
5. Repeat 3 and 4 until neither improves.

Unmet demand and min counts are priced at the relaxed formulation's penalties throughout, so a
plan the greedy repair left short is pulled toward feasibility first and cost second; in the
relaxed problem what cannot be met simply stays short. Every move is priced with the change
penalty (`planner_mip.change_terms`), so run from today's fleet the search makes only moves that
save more than the instances they start and stop are charged.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fleetwarden.forecasting.planner_mip import Formulated, cover_needs, penalties
from fleetwarden.forecasting.planner_model import FloatArray, IntArray, Problem

_TOL = 1e-9


@dataclass
class _State:
    """Instance counts and the running sums every move keeps consistent."""

    p: Problem
    x: IntArray
    pair_of: IntArray
    pool_gpus: IntArray
    pool_count: IntArray
    model_served: FloatArray
    pair_count: IntArray
    version_model: IntArray
    version_pool: IntArray

    @classmethod
    def start(cls, p: Problem, x: IntArray, pair_of: IntArray) -> _State:
        g = p.model_gpus[p.t_model]
        pools = len(p.spec.pools)
        return cls(
            p,
            x,
            pair_of,
            np.bincount(p.t_pool, weights=g * x, minlength=pools).astype(np.int64),
            np.bincount(p.t_pool, weights=x, minlength=pools).astype(np.int64),
            np.bincount(p.t_model, weights=p.t_theta * x, minlength=p.n_models).astype(np.float64),
            np.bincount(pair_of, weights=x, minlength=p.mr_model.size).astype(np.int64),
            np.zeros(p.n_models, np.int64),
            np.zeros(pools, np.int64),
        )

    def room(self, ts: IntArray, pair_limit: bool = True) -> IntArray:
        """How many more instances each triple could take: pools, its bound, the pair's max."""
        p = self.p
        q = p.t_pool[ts]
        room = p.t_upper[ts] - self.x[ts]
        cap = p.pool_gpus[q]
        g = p.model_gpus[p.t_model[ts]]
        room = np.where(cap >= 0, np.minimum(room, (cap - self.pool_gpus[q]) // g), room)
        cap = p.pool_instances[q]
        room = np.where(cap >= 0, np.minimum(room, cap - self.pool_count[q]), room)
        if pair_limit:
            pair = self.pair_of[ts]
            room = np.minimum(room, p.mr_max[pair] - self.pair_count[pair])
        result: IntArray = np.maximum(room, 0)
        return result

    def add(self, t: int, amount: int) -> None:
        p = self.p
        q, i = p.t_pool[t], p.t_model[t]
        self.x[t] += amount
        self.pool_gpus[q] += amount * p.model_gpus[i]
        self.pool_count[q] += amount
        self.model_served[i] += amount * p.t_theta[t]
        self.pair_count[self.pair_of[t]] += amount
        self.version_model[i] += 1
        self.version_pool[q] += 1

    def marginal(self, ts: IntArray) -> FloatArray:
        """Cost of one more instance at each triple: start-up cost and the change penalty once
        at or above today's count; below it, one more undoes a stop and earns the penalty back."""
        p = self.p
        above = self.x[ts] >= p.t_current[ts]
        change = np.where(above, p.t_sigma[ts] + p.t_change[ts], -p.t_change[ts])
        result: FloatArray = p.t_cost[ts] + change
        return result


def _cost(p: Problem, ts: IntArray, x: IntArray) -> FloatArray:
    """The MIP's objective for count vectors x (rows) on triples ts (columns): hourly cost,
    start-up cost and the change penalty, so every move is priced as the solvers price it."""
    delta = x - p.t_current[ts]
    over = np.maximum(delta, 0)
    result: FloatArray = x @ p.t_cost[ts] + over @ p.t_sigma[ts] + np.abs(delta) @ p.t_change[ts]
    return result


@dataclass(frozen=True)
class _Move:
    now: float
    best: float
    vector: IntArray


class Heuristic:
    def __init__(
        self,
        p: Problem,
        form: Formulated,
        penalty_factor: float,
        stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """`stop` is polled between sweeps and exchanges (the caller's time limit)."""
        self.p = p
        self.form = form
        self.stop = stop
        self.pair_of = p.t_pair
        order = np.argsort(p.t_pair, kind="stable")
        bounds = np.searchsorted(p.t_pair[order], np.arange(p.mr_model.size + 1))
        self.pairs = [order[a:b] for a, b in itertools.pairwise(bounds.tolist())]
        self.by_model = [p.triples_of_model(i) for i in range(p.n_models)]
        self.by_pool = [np.flatnonzero(p.t_pool == q) for q in range(len(p.spec.pools))]
        self.penalty, self.min_penalty = penalties(p, penalty_factor)
        # A model's total row exists only when epsilon < 1 (else the regions' rows imply it,
        # and with pools too small, capacity in another region would serve nobody).
        self.has_total = np.array([m.epsilon < 1.0 for m in p.spec.models], dtype=bool)
        self._move_cache: dict[tuple[float, ...], IntArray] = {}

    # -- construction -------------------------------------------------------------------------

    def _fill(self, s: _State, ts: IntArray, need: float, weight: FloatArray) -> None:
        """Add instances among ts until weight . x >= need, or nothing fits."""
        while True:
            residual = need - float(weight @ s.x[ts])
            if residual <= _TOL * max(1.0, need):
                return
            room = s.room(ts)
            if not np.any(room > 0):
                return
            value = s.marginal(ts) / np.minimum(weight, residual)
            value[room <= 0] = np.inf
            s.add(int(ts[int(np.argmin(value))]), 1)

    def _round_up(self, s: _State, fraction: FloatArray) -> None:
        """Round up the LP's largest fractional parts first, while pools have room.

        Where pools bind, the LP has already decided which models get their capacity; rounding
        by largest remainder keeps that decision instead of letting the greedy repair hand the
        room to whichever pair it visits first.
        """
        for t in np.argsort(-fraction, kind="stable").tolist():
            if fraction[t] <= 1e-6:
                break
            if s.room(np.array([t]))[0] > 0:
                s.add(t, 1)

    def _repair(self, s: _State) -> None:
        p = self.p
        for k, ts in enumerate(self.pairs):
            if ts.size and p.mr_min[k] > 0:
                self._fill(s, ts, float(p.mr_min[k]), np.ones(ts.size))
        for k, ts in enumerate(self.pairs):
            if ts.size and p.mr_demand[k] > 0:
                self._fill(s, ts, float(p.mr_demand[k]), p.t_theta[ts])
        for i, ts in enumerate(self.by_model):
            if ts.size and p.model_total[i] > 0 and self.has_total[i]:
                self._fill(s, ts, float(p.model_total[i]), p.t_theta[ts])

    def _trim(self, s: _State) -> None:
        """Drop instances that no row needs, those whose removal saves most first."""
        p = self.p
        above = s.x > p.t_current
        saves = p.t_cost + np.where(above, p.t_sigma + p.t_change, -p.t_change)
        order = np.argsort(-saves, kind="stable")
        for t in order.tolist():
            k, i, theta = int(self.pair_of[t]), int(p.t_model[t]), float(p.t_theta[t])
            ts = self.pairs[k]
            while s.x[t] > 0 and s.pair_count[k] > p.mr_min[k]:
                served = float(p.t_theta[ts] @ s.x[ts])
                if served - theta < p.mr_demand[k] - 1e-9 * max(1.0, p.mr_demand[k]):
                    break
                need = p.model_total[i] if self.has_total[i] else 0.0
                if s.model_served[i] - theta < need - 1e-9 * max(1.0, need):
                    break
                s.add(t, -1)

    # -- local search -------------------------------------------------------------------------

    def _moves(self, k: int) -> IntArray:
        """Every move tried for pair k, as rows of count changes; the zero move comes first.

        Two families: a box (+-1 per GPU type up to 8 types, single steps beyond, and +-2 on
        one type), and transfers that replace d = 1..4 instances of one type by just enough of
        another, or one fewer (one fast GPU for five slow ones is a move of -1 and +5, far
        outside any small box). They depend only on the pair's throughputs, so are built once.
        """
        theta = self.p.t_theta[self.pairs[k]]
        key = tuple(theta.tolist())  # pairs of one model share their throughputs
        cached = self._move_cache.get(key)
        if cached is not None:
            return cached
        n = theta.size
        eye = np.eye(n, dtype=np.int64)
        if n <= 8:
            grid = np.meshgrid(*[np.arange(-1, 2)] * n, indexing="ij")
            box = np.stack([g.ravel() for g in grid], axis=1)
            box = box[np.any(box != 0, axis=1)]
        else:
            box = np.concatenate([eye, -eye])
        # transfers[a, d, e, b] = -d at a, +need(a, d, b) - 1 + e at b
        d = np.arange(1, 5)
        need = np.ceil(d[None, :, None] * theta[:, None, None] / theta[None, None, :] - 1e-9)
        transfers = np.zeros((n, 4, 2, n, n), dtype=np.int64)
        a_idx = np.arange(n)
        transfers[a_idx, :, :, :, a_idx] -= d[None, :, None, None]
        for e in (0, 1):
            transfers[:, :, e, a_idx, a_idx] += (need - 1 + e).astype(np.int64)
        flat = transfers.reshape(-1, n)
        flat = flat[np.any(flat != 0, axis=1)]
        result = np.concatenate([np.zeros((1, n), np.int64), box, 2 * eye, -2 * eye, flat])
        self._move_cache[key] = result
        return result

    def _evaluate(
        self, s: _State, k: int, ceiling: IntArray | None = None, extra: IntArray | None = None
    ) -> _Move | None:
        """Cheapest count vector for pair k near the current one, everything else fixed.

        `ceiling` caps counts per type (to make a pair give up an instance); `extra` adds room
        per type (to price what a pair would do with an instance another pair gives up). The
        returned `now` is the current vector's price, `best` the cheapest allowed one's.
        """
        p = self.p
        ts = self.pairs[k]
        if ts.size == 0:
            return None
        current = s.x[ts]
        room = s.room(ts, pair_limit=False)
        if extra is not None:
            room = room + extra
        top = current + room if ceiling is None else np.minimum(ceiling, current + room)
        candidates = current + self._moves(k)
        allowed = np.all((candidates >= 0) & (candidates <= top), axis=1)
        theta = p.t_theta[ts]
        served = candidates @ theta
        counts = candidates.sum(axis=1)
        allowed &= counts <= max(int(p.mr_max[k]), int(counts[0]))
        if not np.any(allowed):
            return None
        i = int(p.mr_model[k])
        others = float(s.model_served[i]) - float(served[0])
        short = np.maximum(p.mr_demand[k] - served, 0.0)
        if self.has_total[i]:
            short += np.maximum(p.model_total[i] - others - served, 0.0)
        cost = _cost(p, ts, candidates) + self.penalty[i] / p.model_theta_max[i] * short
        if not self.form.relaxed:  # strict: any shortfall at all makes the plan unusable
            cost += self.penalty[i] * (short > 1e-9 * p.model_theta_max[i])
        cost += self.min_penalty * np.maximum(p.mr_min[k] - counts, 0)
        now = float(cost[0])
        cost[~allowed] = np.inf
        best = int(np.argmin(cost))
        return _Move(now, float(cost[best]), candidates[best])

    def _apply(self, s: _State, k: int, vector: IntArray) -> None:
        for t, delta in zip(
            self.pairs[k].tolist(), (vector - s.x[self.pairs[k]]).tolist(), strict=True
        ):
            if delta:
                s.add(t, delta)

    def _improve_pair(self, s: _State, k: int) -> bool:
        move = self._evaluate(s, k)
        if move is None or not move.best < move.now - 1e-9 * max(1.0, abs(move.now)):
            return False
        self._apply(s, k, move.vector)
        return True

    def _sweeps(self, s: _State, stop: Callable[[], bool], limit: int = 8) -> bool:
        """Pair moves until none improves; skips pairs whose model and pools have not moved."""
        seen: dict[int, tuple[int, int]] = {}
        moved = False
        for _ in range(limit):
            if stop():
                break
            changed = False
            for k, ts in enumerate(self.pairs):
                stamp = (
                    int(s.version_model[self.p.mr_model[k]]),
                    int(s.version_pool[self.p.t_pool[ts]].sum()),
                )
                if seen.get(k) == stamp:
                    continue
                if self._improve_pair(s, k):
                    changed = moved = True
                else:
                    seen[k] = stamp
            if not changed:
                break
        return moved

    def _exchange(self, s: _State, q: int) -> bool:
        """In full pool q: the cheapest giver frees an instance if some taker gains more."""
        p = self.p
        members = self.by_pool[q]
        givers: list[tuple[float, int, IntArray]] = []
        for t in members[s.x[members] > 0].tolist():
            k = int(self.pair_of[t])
            ceiling = s.x[self.pairs[k]].copy()
            ceiling[self.pairs[k] == t] -= 1
            move = self._evaluate(s, k, ceiling=ceiling)
            if move is not None and np.isfinite(move.best):
                givers.append((move.best - move.now, t, move.vector))
        if not givers:
            return False
        loss, giver, vector = min(givers, key=lambda g: g[0])
        freed = int(p.model_gpus[p.t_model[giver]])
        gpus_free = int(p.pool_gpus[q] - s.pool_gpus[q])
        best_gain, taker = 0.0, -1
        for t in members.tolist():
            k = int(self.pair_of[t])
            if k == self.pair_of[giver]:
                continue
            g = int(p.model_gpus[p.t_model[t]])
            more = 1 << 30
            if p.pool_gpus[q] >= 0:
                more = (gpus_free + freed) // g - gpus_free // g
            if p.pool_instances[q] >= 0:
                more = min(more, 1)
            if more <= 0:
                continue
            extra = (self.pairs[k] == t).astype(np.int64) * more
            move = self._evaluate(s, k, extra=extra)
            if move is not None and move.now - move.best > best_gain:
                best_gain, taker = move.now - move.best, t
        if taker < 0 or best_gain <= loss + 1e-9 * max(1.0, abs(loss)):
            return False
        giver_pair = int(self.pair_of[giver])
        before = s.x[self.pairs[giver_pair]].copy()
        self._apply(s, giver_pair, vector)
        if self._improve_pair(s, int(self.pair_of[taker])):
            return True
        self._apply(s, giver_pair, before)  # the taker could not use it after all: undo
        return False

    def _full_pools(self, s: _State) -> list[int]:
        p = self.p
        full = []
        for q, members in enumerate(self.by_pool):
            bounded = p.pool_gpus[q] >= 0 or p.pool_instances[q] >= 0
            used = members.size > 0 and bool(np.any(s.x[members] > 0))
            if bounded and used and np.any(s.room(members, pair_limit=False) == 0):
                full.append(q)
        return full

    def run(self, lp_values: FloatArray) -> IntArray:
        """Integer instance counts per triple, from the LP relaxation's column values."""
        lp = lp_values[self.form.x_cols]
        start = np.floor(lp + 1e-6).astype(np.int64)
        s = _State.start(self.p, np.maximum(start, 0), self.pair_of)
        self._round_up(s, lp - start)
        self._repair(s)
        self._trim(s)
        return self._local_search(s)

    def improve(self, x: IntArray) -> IntArray:
        """Local search from any integer plan (e.g. the MIP solver's)."""
        return self._local_search(_State.start(self.p, x.copy(), self.pair_of))

    def near_current(self) -> IntArray:
        """A plan near today's fleet, also when that fleet no longer meets the forecast.

        Today's counts (cut to each triple's bound), what overfills a pool or a pair's max
        stopped (`_shed`), the cheapest instances that restore min counts and demand added, then
        the local search: every move it makes must pay for its change penalty. Why also when
        today's fleet falls short: otherwise a forecast 2% above it left only the LP-rounded
        plan, built without regard to today's fleet: 3 + 3 instances on two pools of equal price
        became 0 + 7 instead of 4 + 3.
        """
        p = self.p
        s = _State.start(p, np.minimum(p.t_current, np.maximum(p.t_upper, 0)), self.pair_of)
        self._shed(s)
        self._repair(s)
        return self._local_search(s)

    def _shed(self, s: _State) -> None:
        """Stop instances until every pair is within its max and every pool its capacity.

        Today's counts overfill a pool that shrank (each triple's own bound is not the pool's
        when models share it), and the repair and the search only add or move into free room:
        that plan stayed infeasible and was dropped, and CBC and the naive path started from
        nothing and moved far more instances than needed. Rule (`_loss`): stop the least needed
        instance first: those no row needs, the one leaving its rows the most slack first (so
        later stops are less likely to be needed), the dearest on a tie; then those whose
        shortfall free room elsewhere makes up, cheapest first; last what nothing replaces.
        The plan then fits every pool and max; the repair restores what room allows."""
        p = self.p
        for k in np.flatnonzero(s.pair_count > p.mr_max).tolist():
            while s.pair_count[k] > p.mr_max[k]:
                self._give_up(s, self.pairs[k])
        gpu_cap, count_cap = p.pool_gpus, p.pool_instances
        for q, members in enumerate(self.by_pool):
            while (0 <= gpu_cap[q] < s.pool_gpus[q]) or (0 <= count_cap[q] < s.pool_count[q]):
                self._give_up(s, members)

    def _give_up(self, s: _State, members: IntArray) -> None:
        ts = members[s.x[members] > 0]  # not empty: the pool or pair is over its bound
        keys = [self._loss(s, t) for t in ts.tolist()]
        s.add(int(ts[keys.index(min(keys))]), -1)

    def _loss(self, s: _State, t: int) -> tuple[bool, float, float]:
        """Sort key of stopping one instance at t: does it leave a row short (region demand, min,
        model total); if not, minus the least slack left them (in instances, of the fastest type
        for demand), else its cost; then its cost: the change penalty less its hourly cost, plus
        each shortfall priced at the cheapest free room left that makes it up, else at the
        search's penalty for what stays unmet."""
        p = self.p
        k, i = int(self.pair_of[t]), int(p.t_model[t])
        pair, model, fast = self.pairs[k], self.by_model[i], float(p.model_theta_max[i])
        s.add(t, -1)  # priced after the stop: the pair's max then has room for one more
        rows = []  # binding rows: triples serving it, units per instance, units short, unmet price
        if p.mr_demand[k] > 0:
            short = float(p.mr_demand[k] - p.t_theta[pair] @ s.x[pair]) / fast
            rows.append((pair, p.t_theta[pair] / fast, short, float(self.penalty[i])))
        if p.mr_min[k] > 0:
            short = float(p.mr_min[k] - s.pair_count[k])
            rows.append((pair, np.ones(pair.size), short, self.min_penalty))
        if self.has_total[i] and p.model_total[i] > 0:
            short = float(p.model_total[i] - s.model_served[i]) / fast
            rows.append((model, p.t_theta[model] / fast, short, float(self.penalty[i])))
        loss = float(p.t_change[t] - p.t_cost[t])
        for ts, units, short, unmet in rows:
            if short <= _TOL:
                continue
            keep = ts != t  # never "made up" by undoing the stop
            room, price = s.room(ts[keep]), s.marginal(ts[keep]) / units[keep]
            covered = float(room @ units[keep]) >= short * (1.0 - _TOL)
            loss += short * (float(price[room > 0].min()) if covered else unmet)
        s.add(t, 1)
        worst = max((row[2] for row in rows), default=-np.inf)
        return worst > _TOL, loss if worst > _TOL else worst, loss

    def _local_search(self, s: _State, rounds: int = 6) -> IntArray:
        self._sweeps(s, self.stop)
        for _ in range(rounds):
            exchanged = False
            for q in self._full_pools(s):
                if self.stop():
                    break
                exchanged = self._exchange(s, q) or exchanged
            if not exchanged:
                break
            self._sweeps(s, self.stop)
        return s.x


def complete(p: Problem, form: Formulated, x: IntArray) -> FloatArray:
    """A full column vector of the tight formulation for instance counts x: u and slacks set."""
    values = np.zeros(form.mip.n_cols)
    values[form.x_cols] = x
    has_u = form.u_cols >= 0
    values[form.u_cols[has_u]] = np.maximum(x - p.t_current, 0)[has_u]
    units = p.t_theta * x / p.model_theta_max[p.t_model]
    pair = p.t_pair
    per_pair = np.bincount(pair, weights=units, minlength=p.mr_model.size)
    count = np.bincount(pair, weights=x, minlength=p.mr_model.size)
    per_model = np.bincount(p.t_model, weights=units, minlength=p.n_models)
    need, model_need = cover_needs(p)
    for k, col in enumerate(form.region_slack.tolist()):
        if col >= 0:
            values[col] = max(0.0, float(need[k] - per_pair[k]))
    for i, col in enumerate(form.model_slack.tolist()):
        if col >= 0:
            values[col] = max(0.0, float(model_need[i] - per_model[i]))
    for k, col in enumerate(form.min_slack.tolist()):
        if col >= 0:
            values[col] = max(0.0, float(p.mr_min[k] - count[k]))
    return values
