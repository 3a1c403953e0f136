"""Mixed-integer rounding (MIR) cuts for the planner's covering rows, separated in bulk.

Every demand row reads sum_k a_k x_k (+ s) >= b: instances x_k >= 0 of GPU types with
throughput a_k (in units of the model's fastest instance), and in the relaxed problem a
continuous unserved-demand slack s >= 0. For any divisor t > 0 with f = frac(b / t) > 0,
mixed-integer rounding gives the valid inequality

    sum_k (floor(a_k / t) + min(frac(a_k / t), f) / f) x_k + s / (t f) >= ceil(b / t).

With t = the throughput of one GPU type it says "this region needs at least ceil(b / t) of
those instances, where faster ones count a little extra": the whole-instance fact the LP
relaxation lacks, and most of its gap to the integer optimum. The same formula holds for any
real a_k, so pool rows sum g_i x_i <= C are cut as -sum g_i x_i >= -C: with instances of 4 GPUs
a pool of 10 holds 2 of them, not 2.5. Divisors are the row's coefficients (in absolute value)
and their halves and quarters (Marchand and Wolsey's choice); each row contributes its most
violated cut, if any, per round.

Rows are grouped by length and handled as dense matrices, so a round over 1,000 rows costs a few
numpy operations per divisor instead of a Python loop per row and divisor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetwarden.forecasting.planner_mip import INF, Row, SparseMip
from fleetwarden.forecasting.planner_model import FloatArray, IntArray


@dataclass(frozen=True)
class _Group:
    rows: IntArray
    int_cols: IntArray
    """(rows, k): integer columns."""
    a: FloatArray
    cont_cols: IntArray
    """(rows, m): continuous columns (slack), m may be 0."""
    s: FloatArray
    b: FloatArray


DIVISOR_SCALES = (1.0, 0.5, 0.25)


class MirSeparator:
    """Built once per formulation; `separate(x)` returns cuts violated by x."""

    def __init__(self, mip: SparseMip, covers: IntArray, packs: IntArray) -> None:
        """`covers`: rows a.x >= b; `packs`: rows a.x <= b, taken as -a.x >= -b."""
        buckets: dict[tuple[int, int], list[tuple[int, IntArray, FloatArray, IntArray, FloatArray]]]
        buckets = {}
        rhs: dict[int, float] = {}
        for sign, rows in ((1.0, covers), (-1.0, packs)):
            for r in rows.tolist():
                cols, vals = mip.row(r)
                vals = sign * vals
                rhs[r] = float(mip.row_lower[r] if sign > 0 else -mip.row_upper[r])
                integer = mip.col_integer[cols]
                entry = (r, cols[integer], vals[integer], cols[~integer], vals[~integer])
                buckets.setdefault((int(integer.sum()), int((~integer).sum())), []).append(entry)
        self.groups = [
            _Group(
                rows=np.array([e[0] for e in entries], dtype=np.int64),
                int_cols=np.array([e[1] for e in entries], dtype=np.int64).reshape(len(entries), k),
                a=np.array([e[2] for e in entries]).reshape(len(entries), k),
                cont_cols=np.array([e[3] for e in entries], dtype=np.int64).reshape(
                    len(entries), m
                ),
                s=np.array([e[4] for e in entries]).reshape(len(entries), m),
                b=np.array([rhs[e[0]] for e in entries]),
            )
            for (k, m), entries in sorted(buckets.items())
            if k > 0
        ]

    def separate(self, x: FloatArray, min_violation: float = 1e-5) -> list[Row]:
        cuts: list[Row] = []
        for g in self.groups:
            xi, xs = x[g.int_cols], x[g.cont_cols]
            best = np.full(g.rows.size, min_violation)
            divisor = np.zeros(g.rows.size)
            for base in self._divisors(g):
                for scale in DIVISOR_SCALES:
                    t = base * scale
                    violation = self._violation(g, t, xi, xs)
                    better = violation > best
                    best[better], divisor[better] = violation[better], t[better]
            for n in np.flatnonzero(divisor > 0).tolist():
                t = divisor[n]
                coef, cont, rhs = _mir(g.a[n], g.s[n], float(g.b[n]), float(t))
                cols = np.concatenate([g.int_cols[n], g.cont_cols[n]])
                cuts.append(Row(cols, np.concatenate([coef, cont]), rhs, INF))
        return cuts

    @staticmethod
    def _divisors(g: _Group) -> list[FloatArray]:
        """Per row, each of its coefficients; or, when the group uses few distinct values (pool
        rows: GPUs per instance), each of those for every row: any t > 0 gives a valid cut."""
        magnitudes = np.abs(g.a)
        distinct = np.unique(magnitudes[magnitudes > 1e-9])
        if distinct.size < g.a.shape[1]:
            return [np.full(g.rows.size, t) for t in distinct]
        return [magnitudes[:, d] for d in range(g.a.shape[1])]

    @staticmethod
    def _violation(g: _Group, t: FloatArray, xi: FloatArray, xs: FloatArray) -> FloatArray:
        safe = np.where(t > 1e-9, t, 1.0)
        beta = g.b / safe
        f = beta - np.floor(beta)
        ok = (t > 1e-9) & (f > 1e-6) & (f < 1.0 - 1e-6)
        f = np.where(ok, f, 0.5)
        q = g.a / safe[:, None]
        whole = np.floor(q + 1e-9)
        fq = q - whole
        fq[fq < 1e-9] = 0.0
        coef = whole + np.minimum(fq, f[:, None]) / f[:, None]
        cont = np.maximum(g.s, 0.0) / (safe * f)[:, None]
        violation: FloatArray = np.ceil(beta) - (coef * xi).sum(axis=1) - (cont * xs).sum(axis=1)
        violation[~ok] = -INF
        return violation


def _mir(a: FloatArray, s: FloatArray, b: float, t: float) -> tuple[FloatArray, FloatArray, float]:
    beta = b / t
    f = beta - np.floor(beta)
    q = a / t
    whole = np.floor(q + 1e-9)
    fq = q - whole
    fq[fq < 1e-9] = 0.0
    return whole + np.minimum(fq, f) / f, np.maximum(s, 0.0) / (t * f), float(np.ceil(beta))
