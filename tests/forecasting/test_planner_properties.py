"""Properties every plan has, on random small fleets (hypothesis).

Every plan, feasible or not: counts are whole and >= 0 (so delta >= -n), within max per
(model, region), within every pool's GPUs and slots, at least min unless reported short, and only
where the model may run. When the forecast fits, each region gets epsilon of its peak and each
model its total. When it does not, the plan is relaxed and serves everything that fits: no
unserved demand has an instance it could have started.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from fleetwarden.forecasting.planner import (
    Formulation,
    ModelSpec,
    Plan,
    PlanInput,
    PlannerConfig,
    PoolSpec,
    RegionBounds,
    RunStatus,
    plan,
)
from fleetwarden.forecasting.planner_instances import random_instance

REGIONS = ("r0", "r1")
GPUS = ("g0", "g1")
# Exact optimum in the relaxed case too, so "serves all that fits" is crisp.
CONFIG = PlannerConfig(mip_rel_gap=1e-7, time_limit_seconds=20.0)
TOL = 1e-6


@st.composite
def fleets(draw: st.DrawFn) -> PlanInput:
    pools: list[PoolSpec] = []
    for region in REGIONS:
        for gpu in GPUS:
            if draw(st.booleans()) or not pools:
                pools.append(
                    PoolSpec(
                        region,
                        gpu,
                        cost_per_gpu_hour=draw(st.sampled_from([1.0, 2.5, 4.0, 9.0])),
                        gpus=draw(st.one_of(st.none(), st.integers(0, 16))),
                        instances=draw(st.one_of(st.none(), st.integers(0, 6))),
                        load_seconds=draw(st.sampled_from([0.0, 300.0, 900.0])),
                    )
                )
    models = []
    for i in range(draw(st.integers(1, 3))):
        throughput = {
            g: float(draw(st.integers(500, 5000))) for g in GPUS if draw(st.integers(0, 3)) > 0
        }
        regions = {}
        for region in REGIONS:
            if draw(st.integers(0, 3)) > 0:
                low = draw(st.integers(0, 2))
                regions[region] = RegionBounds(low, low + draw(st.integers(0, 6)))
        models.append(
            ModelSpec(
                f"m{i}",
                throughput,
                regions,
                gpus_per_instance=draw(st.sampled_from([1, 1, 2])),
                epsilon=draw(st.sampled_from([0.5, 0.8, 1.0])),
            )
        )
    current = {
        (m.name, p.region, p.gpu_type): draw(st.integers(0, 3))
        for m in models
        for p in pools
        if draw(st.booleans())
    }
    peak = {(m.name, r): float(draw(st.integers(0, 12_000))) for m in models for r in REGIONS}
    return PlanInput(tuple(models), tuple(pools), current, peak)


def _served(spec: PlanInput, result: Plan) -> dict[tuple[str, str], float]:
    theta = {m.name: m.throughput for m in spec.models}
    served: dict[tuple[str, str], float] = defaultdict(float)
    for e in result.entries:
        served[(e.model, e.region)] += e.target * theta[e.model].get(e.gpu_type, 0.0)
    return served


def _could_start(spec: PlanInput, result: Plan, model: ModelSpec, region: str | None) -> bool:
    """Is there a pool (in `region`, or anywhere) where one more instance of model would fit?"""
    count: dict[str, int] = defaultdict(int)
    for e in result.entries:
        if e.model == model.name:
            count[e.region] += e.target
    use = {(u.region, u.gpu_type): u for u in result.pools}
    for pool in spec.pools:
        bounds = model.regions.get(pool.region)
        if region not in (None, pool.region) or bounds is None:
            continue
        if (
            model.throughput.get(pool.gpu_type, 0.0) <= 0
            or count[pool.region] >= bounds.max_instances
        ):
            continue
        u = use[(pool.region, pool.gpu_type)]
        gpus_ok = pool.gpus is None or u.used_gpus + model.gpus_per_instance <= pool.gpus
        slots_ok = pool.instances is None or u.used_instances + 1 <= pool.instances
        if gpus_ok and slots_ok:
            return True
    return False


def _check_hard_limits(spec: PlanInput, result: Plan) -> None:
    models = {m.name: m for m in spec.models}
    gpus: dict[tuple[str, str], int] = defaultdict(int)
    slots: dict[tuple[str, str], int] = defaultdict(int)
    count: dict[tuple[str, str], int] = defaultdict(int)
    for e in result.entries:
        assert e.target >= 0
        assert e.delta == e.target - e.current
        assert e.delta >= -e.current
        m = models[e.model]
        if e.target:
            assert m.throughput.get(e.gpu_type, 0.0) > 0
            assert e.region in m.regions
        gpus[(e.region, e.gpu_type)] += e.target * m.gpus_per_instance
        slots[(e.region, e.gpu_type)] += e.target
        count[(e.model, e.region)] += e.target
    for pool in spec.pools:
        key = (pool.region, pool.gpu_type)
        assert pool.gpus is None or gpus[key] <= pool.gpus
        assert pool.instances is None or slots[key] <= pool.instances
    short = {(s.model, s.region): s.missing for s in result.short_min}
    for m in spec.models:
        for region, bounds in m.regions.items():
            n = count[(m.name, region)]
            assert n <= bounds.max_instances
            assert n + short.get((m.name, region), 0) >= bounds.min_instances
    assert not short or result.relaxed


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_every_plan_respects_bounds_capacity_and_demand(spec: PlanInput) -> None:
    result = plan(spec, CONFIG)
    assert result.status == RunStatus.OPTIMAL
    assert result.gap is not None
    assert result.gap <= 1e-6
    _check_hard_limits(spec, result)
    served = _served(spec, result)
    if not result.relaxed:
        assert result.unserved == ()
        assert result.short_min == ()
        for m in spec.models:
            total = 0.0
            for region in REGIONS:
                need = m.epsilon * spec.peak[(m.name, region)]
                assert served[(m.name, region)] >= need - TOL * max(1.0, need)
                total += spec.peak[(m.name, region)]
            assert sum(served[(m.name, r)] for r in REGIONS) >= total - TOL * max(1.0, total)
        return
    # Relaxed: whatever is short could not have been served by one more instance.
    models = {m.name: m for m in spec.models}
    for u in result.unserved:
        m = models[u.model]
        if u.tokens_per_s > 0.01 * max(m.throughput.values(), default=1.0):
            assert not _could_start(spec, result, m, u.region), u


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_plans_are_reproducible(spec: PlanInput) -> None:
    first, second = plan(spec, CONFIG), plan(spec, CONFIG)
    assert first.targets == second.targets
    assert first.solver_objective == second.solver_objective


def _keeps_current(spec: PlanInput) -> bool:
    """Is today's fleet a strict (unrelaxed) plan for spec? Computed from the input alone."""
    models = {m.name: m for m in spec.models}
    pools = {(p.region, p.gpu_type): p for p in spec.pools}
    served: dict[tuple[str, str], float] = defaultdict(float)
    count: dict[tuple[str, str], int] = defaultdict(int)
    gpus: dict[tuple[str, str], int] = defaultdict(int)
    slots: dict[tuple[str, str], int] = defaultdict(int)
    for (name, region, gpu), n in spec.current.items():
        m = models[name]
        if n and (region not in m.regions or m.throughput.get(gpu, 0.0) <= 0):
            return False  # it would be stopped: not the fleet of today
        served[(name, region)] += n * m.throughput.get(gpu, 0.0)
        count[(name, region)] += n
        gpus[(region, gpu)] += n * m.gpus_per_instance
        slots[(region, gpu)] += n
    for key, pool in pools.items():
        if (pool.gpus is not None and gpus[key] > pool.gpus) or (
            pool.instances is not None and slots[key] > pool.instances
        ):
            return False
    for m in spec.models:
        for region, bounds in m.regions.items():
            if not bounds.min_instances <= count[(m.name, region)] <= bounds.max_instances:
                return False
        total = sum(v for (name, _), v in spec.peak.items() if name == m.name)
        if sum(v for (name, _), v in served.items() if name == m.name) < total - TOL * total:
            return False
        for (name, region), value in spec.peak.items():
            need = m.epsilon * value
            if name == m.name and served[(name, region)] < need - TOL * need:
                return False
    return True


def _current_cost(spec: PlanInput) -> float:
    gpus = {m.name: m.gpus_per_instance for m in spec.models}
    price = {(p.region, p.gpu_type): p.cost_per_gpu_hour for p in spec.pools}
    return sum(n * gpus[m] * price[(r, g)] for (m, r, g), n in spec.current.items())


benchmark_fleets = st.builds(
    random_instance,
    st.integers(6, 20),
    st.integers(2, 3),
    st.integers(2, 3),
    seed=st.integers(0, 2**20),
)
"""Shaped like production (planner_instances): big enough that a plan within 1% of the bound
is often dearer than the fleet it replaces, which the tiny `fleets()` almost never show."""


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(fleets(), benchmark_fleets),
    st.sampled_from([1.0, 1.0, 0.9, 0.6]),
    st.sampled_from(list(Formulation)),
)
@example(random_instance(10, 2, 3, seed=20), 1.0, Formulation.TIGHT)
@example(random_instance(10, 2, 2, seed=3), 1.0, Formulation.NAIVE)
def test_a_plan_never_costs_more_than_keeping_the_current_fleet(
    spec: PlanInput, demand_factor: float, formulation: Formulation
) -> None:
    """Today's fleet is the previous plan, and the peaks stay or fall (to what that plan serves,
    if it was short), so keeping it is feasible. The plan's objective (hourly cost plus start-up)
    is then at most staying's, and anything that moves makes it strictly cheaper.

    Before staying was a candidate, the explicit examples moved instances for a plan up to 1%
    dearer than staying: within the gap of the bound, so "optimal", and never better.
    """
    config = PlannerConfig(formulation=formulation, time_limit_seconds=20.0)
    first = plan(spec, config)
    served = _served(spec, first)
    source = served if first.relaxed else spec.peak
    peak = {k: source.get(k, 0.0) * demand_factor for k in spec.peak}
    spec = replace(spec, current=first.targets, peak=peak)
    assume(_keeps_current(spec))  # only a min the pools cannot hold makes it fail
    stay = _current_cost(spec)
    result = plan(spec, config)
    assert not result.relaxed
    assert result.status == RunStatus.OPTIMAL
    assert result.cost_per_hour + result.startup_cost <= stay + 1e-9 * max(1.0, stay)
    if any(result.deltas.values()):  # a move only when it pays, by the planner's own objective
        assert result.objective < -1e-9 * max(1.0, stay)
    else:
        assert result.objective == pytest.approx(0.0, abs=1e-9 * max(1.0, stay))
