"""Properties every plan has, on random small fleets (hypothesis).

Every plan, feasible or not: counts are whole and >= 0 (so delta >= -n), within max per
(model, region), within every pool's GPUs and slots, at least min unless reported short, and only
where the model may run. When the forecast fits, each region gets epsilon of its peak and each
model its total. When it does not, the plan is relaxed and serves everything that fits: no
unserved demand has an instance it could have started.
"""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetwarden.forecasting.planner import (
    ModelSpec,
    Plan,
    PlanInput,
    PlannerConfig,
    PoolSpec,
    RegionBounds,
    RunStatus,
    plan,
)

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
