"""The plan near today's fleet fits the pools after a shared pool shrank (or a max was lowered).

Reproduction (each test here failed before `Heuristic._shed`): `near_current` cut today's counts
only to each triple's own bound. When several models share a pool that now holds fewer GPUs than
run there, that start still overfilled the pool, and the repair and the local search only add
or move into free room, so it stayed infeasible and was dropped (`planner._near`,
`planner._candidate`): CBC then started from nothing and moved 11 instances where 2 were needed
(the first test), and every path lost the start the change penalty relies on.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetwarden.forecasting.planner import (
    ModelSpec,
    PlanInput,
    PlannerConfig,
    PoolSpec,
    RegionBounds,
    RunStatus,
    plan,
)
from fleetwarden.forecasting.planner_heuristic import Heuristic, complete
from fleetwarden.forecasting.planner_mip import build_naive, build_tight, feasible
from fleetwarden.forecasting.planner_model import IntArray, Problem, compile_problem
from tests.forecasting.test_planner_churn import PATH_IDS, PATHS

SPEED = {"a": 2000.0, "b": 1000.0, "c": 2000.0}


def _strict_plan(p: Problem, x: IntArray) -> bool:
    """Is x a plan of the strict problem, by both formulations the paths hand to a solver?"""
    tight = build_tight(p)
    naive = build_naive(p)
    values = np.zeros(naive.mip.n_cols)
    values[naive.x_cols] = x - p.t_current
    values[naive.u_cols] = np.maximum(x - p.t_current, 0)
    return feasible(tight.mip, complete(p, tight, x)) and feasible(naive.mip, values)


@contextmanager
def _starts() -> Iterator[list[tuple[Problem, IntArray]]]:
    """Every plan `Heuristic.near_current` returns while the block runs, with its problem."""
    seen: list[tuple[Problem, IntArray]] = []
    original = Heuristic.near_current

    def spy(self: Heuristic) -> IntArray:
        x = original(self)
        seen.append((self.p, x.copy()))
        return x

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Heuristic, "near_current", spy)
        yield seen


def _shared_pool() -> PlanInput:
    """One region, three GPU types: a and c serve 2,000 tokens/s per instance at 1 $/h, b 1,000
    at 0.5 $/h (the same price per token). Pool a now has 20 GPUs; 21 instances of four models
    run there. Each model's fleet serves its peak exactly, except m2's, 500 tokens/s over: no
    instance can stop. So one instance must leave a and one start elsewhere: on c (start-up 0,
    load 0 s) rather than two on b (load 30 s, and a penalty as large)."""
    models = tuple(ModelSpec(f"m{i}", SPEED, {"r": RegionBounds(0, 100)}) for i in range(4))
    pools = (
        PoolSpec("r", "a", 1.0, gpus=20, load_seconds=30.0),
        PoolSpec("r", "b", 0.5, gpus=100, load_seconds=30.0),
        PoolSpec("r", "c", 1.0, gpus=100, load_seconds=0.0),
    )
    counts = {"m0": (3, 4, 5), "m1": (8, 1, 4), "m2": (8, 1, 2), "m3": (2, 8, 7)}
    current = {(m, "r", g): n for m, row in counts.items() for g, n in zip("abc", row, strict=True)}
    peak = {("m0", "r"): 20_000.0, ("m1", "r"): 25_000.0, ("m2", "r"): 20_500.0}
    return PlanInput(models, pools, current, {**peak, ("m3", "r"): 26_000.0})


@pytest.mark.parametrize("config", PATHS, ids=PATH_IDS)
def test_a_shared_pool_that_shrank_moves_one_instance(config: PlannerConfig) -> None:
    """Every path starts from a plan that fits pool a and moves 2 instances: one model stops an
    instance on a and starts one on c (46 $/h as today, penalty 0.005 x 2 x 1 $/h). Before, the
    start was infeasible and CBC, from nothing, moved 11 instances for a plan 0.055 $/h dearer
    by the objective."""
    with _starts() as starts:
        result = plan(_shared_pool(), config)
    assert starts
    assert all(_strict_plan(p, x) for p, x in starts)
    assert result.status == RunStatus.OPTIMAL
    assert not result.relaxed
    moved = {key: d for key, d in result.deltas.items() if d}
    assert len(moved) == 2
    assert sorted(moved.values()) == [-1, 1]
    (model_a, _, _), (model_c, _, _) = sorted(moved, key=lambda key: key[2])
    assert model_a == model_c
    assert moved[(model_a, "r", "a")] == -1
    assert result.cost_per_hour == pytest.approx(46.0)
    assert result.change_penalty == pytest.approx(0.01)


@pytest.mark.parametrize("config", PATHS, ids=PATH_IDS)
def test_a_lowered_max_gives_a_start_within_it(config: PlannerConfig) -> None:
    """4 instances at 1,000 tokens/s (1 $/h) and 1 at 2,000 (2.2 $/h) serve a 6,000 peak; the
    max drops to 4. The only plans are 2 + 2 (6.4 $/h) and dearer ones: the start stops a slow
    instance (the least needed: the other stop leaves twice the shortfall) and the search then
    trades a second one for a fast one. Before, the start kept all 5 (over the max) and was
    dropped; the search never stops an instance that is needed."""
    model = ModelSpec("m", {"slow": 1000.0, "fast": 2000.0}, {"r": RegionBounds(0, 4)})
    pools = (PoolSpec("r", "slow", 1.0, gpus=10), PoolSpec("r", "fast", 2.2, gpus=10))
    current = {("m", "r", "slow"): 4, ("m", "r", "fast"): 1}
    spec = PlanInput((model,), pools, current, {("m", "r"): 6000.0})
    with _starts() as starts:
        result = plan(spec, config)
    assert starts
    assert all(_strict_plan(p, x) for p, x in starts)
    assert result.status == RunStatus.OPTIMAL
    assert result.targets == {("m", "r", "slow"): 2, ("m", "r", "fast"): 2}


REGIONS = ("r0", "r1")
GPUS = ("g0", "g1", "g2")


@st.composite
def shrunk_fleets(draw: st.DrawFn) -> tuple[PlanInput, dict[tuple[str, str, str], int]]:
    """Up to four models on two regions x three GPU types (1,000-3,000 tokens/s, 1 or 2 GPUs per
    instance), today's counts serving the peaks (or more), and in each region some pools shrunk
    below what runs there (in GPUs, instances or both) while one pool per region has room for
    anything. Also returns today's fleet minus the excess: what each shrunk pool no longer holds
    stopped, and its tokens/s restarted in the region's roomy pool."""
    models, current, peak = [], {}, {}
    for i in range(draw(st.integers(1, 4))):
        name = f"m{i}"
        speed = {g: float(draw(st.sampled_from([1000, 2000, 3000]))) for g in GPUS}
        regions = draw(st.sampled_from([REGIONS, REGIONS[:1], REGIONS[1:]]))
        bounds = {}
        for r in regions:
            counts = {g: draw(st.integers(0, 4)) for g in GPUS}
            current.update({(name, r, g): n for g, n in counts.items()})
            served = sum(n * speed[g] for g, n in counts.items())
            peak[(name, r)] = served * draw(st.sampled_from([0.0, 0.5, 0.9, 1.0, 1.0]))
            low = draw(st.integers(0, min(2, sum(counts.values()))))
            bounds[r] = RegionBounds(low, 60)
        gpus = draw(st.sampled_from([1, 1, 2]))
        epsilon = draw(st.sampled_from([0.5, 0.8, 1.0]))
        models.append(ModelSpec(name, speed, bounds, gpus_per_instance=gpus, epsilon=epsilon))
    size = {m.name: m.gpus_per_instance for m in models}
    pools = []
    for r in REGIONS:
        roomy = draw(st.sampled_from(GPUS))
        for g in GPUS:
            here = {m: n for (m, r2, g2), n in current.items() if (r2, g2) == (r, g)}
            used = sum(n * size[m] for m, n in here.items())
            gpus = instances = None
            if g != roomy and draw(st.booleans()):
                gpus = draw(st.integers(0, used))
            if g != roomy and draw(st.booleans()):
                instances = draw(st.integers(0, sum(here.values())))
            cost = draw(st.sampled_from([0.5, 1.0, 1.004, 2.0]))
            load = draw(st.sampled_from([0.0, 30.0, 600.0]))
            pools.append(PoolSpec(r, g, cost, gpus=gpus, instances=instances, load_seconds=load))
    spec = PlanInput(tuple(models), tuple(pools), current, peak)
    return spec, _minus_excess(spec)


def _minus_excess(spec: PlanInput) -> dict[tuple[str, str, str], int]:
    """Today's fleet with each bounded pool cut to its capacity, and what a model lost there
    restarted in its region's unbounded pool (as many instances, or more for the tokens/s)."""
    size = {m.name: m.gpus_per_instance for m in spec.models}
    speed = {m.name: m.throughput for m in spec.models}
    roomy = {p.region: p.gpu_type for p in spec.pools if p.gpus is None and p.instances is None}
    fleet = dict(spec.current)
    for pool in spec.pools:
        gpus = 10**9 if pool.gpus is None else pool.gpus
        instances = 10**9 if pool.instances is None else pool.instances
        for key in sorted(k for k in spec.current if k[1:] == (pool.region, pool.gpu_type)):
            model, region, gpu = key
            keep = min(fleet[key], gpus // size[model], instances)
            gpus, instances = gpus - keep * size[model], instances - keep
            stopped, fleet[key] = fleet[key] - keep, keep
            need = -(-stopped * speed[model][gpu] // speed[model][roomy[region]])
            spare = (model, region, roomy[region])
            fleet[spare] = fleet.get(spare, 0) + max(stopped, int(need))
    return fleet


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shrunk_fleets())
def test_the_plan_near_today_fits_shrunk_pools(
    case: tuple[PlanInput, dict[tuple[str, str, str], int]],
) -> None:
    """Whenever today's fleet minus the excess is a plan (checked: it is, by construction), the
    plan near today's fleet is one too: it fits every pool, meets every demand and min."""
    spec, minus_excess = case
    p = compile_problem(spec, PlannerConfig().change_penalty)
    index = {}
    for t in range(p.n_triples):
        pool = spec.pools[int(p.t_pool[t])]
        index[(spec.models[int(p.t_model[t])].name, pool.region, pool.gpu_type)] = t
    reference = np.zeros(p.n_triples, dtype=np.int64)
    for key, n in minus_excess.items():
        reference[index[key]] = n
    assert _strict_plan(p, reference)
    for form in (build_tight(p), build_naive(p)):  # the naive path builds its heuristic on this
        x = Heuristic(p, form, PlannerConfig().penalty_factor).near_current()
        assert _strict_plan(p, x), (x.tolist(), p.t_current.tolist())
