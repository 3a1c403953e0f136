"""The hourly round: API specs + history -> targets per endpoint (fleetwarden/forecasting/hourly.py).

Everything here is real (forecaster, ILP with HiGHS); histories are kept under two days where the
test is not about ARIMA, so the seasonal-naive forecaster answers in milliseconds.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetwarden.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from fleetwarden.api.v1alpha1.regionpool import RegionPoolSpec
from fleetwarden.forecasting.hourly import (
    EndpointHistory,
    EndpointPlan,
    FleetPlanError,
    FleetSpecs,
    PoolUsage,
    RoundInput,
    RoundResult,
    forecast_config,
    plan_round,
)
from fleetwarden.forecasting.series import Series
from fleetwarden.forecasting.series_sum import sum_series

STEP = 300.0
DAY = 86_400.0


def pool(
    region: str,
    *,
    gpus: int | None = 64,
    instances: int | None = None,
    cost: float = 2.0,
    gpu_type: str = "A100",
) -> RegionPoolSpec:
    capacity: dict[str, int] = {}
    if gpus is not None:
        capacity["gpus"] = gpus
    if instances is not None:
        capacity["instances"] = instances
    return RegionPoolSpec.model_validate(
        {"region": region, "gpuType": gpu_type, "capacity": capacity, "costPerHour": cost}
    )


def model(
    regions: list[tuple[str, int, int]],
    *,
    throughput: float = 1000.0,
    gpus: int = 1,
    epsilon: float = 1.0,
    niw_buffer: float = 0.1,
) -> ModelDeploymentSpec:
    return ModelDeploymentSpec.model_validate(
        {
            "model": {"name": "m", "gpusPerInstance": gpus},
            "throughput": {"A100": throughput, "H100": 2 * throughput},
            "regions": [
                {"pool": p, "minInstances": lo, "maxInstances": hi} for p, lo, hi in regions
            ],
            "scaling": {"epsilon": epsilon, "forecast": {"niwBuffer": niw_buffer}},
        }
    )


def flat(level: float, hours: float = 30.0, end_s: float = 10 * DAY) -> Series:
    n = int(hours * 3600 / STEP)
    return Series(end_s - n * STEP, STEP, tuple([level] * n))


def diurnal(base: float, amplitude: float, hours: float = 30.0, end_s: float = 10 * DAY) -> Series:
    n = int(hours * 3600 / STEP)
    start = end_s - n * STEP
    values = [base + amplitude * math.sin(2 * math.pi * (start + i * STEP) / DAY) for i in range(n)]
    return Series(start, STEP, tuple(values))


def test_targets_follow_the_forecast_peak_and_the_niw_buffer() -> None:
    fleet = FleetSpecs({"p": pool("r")}, {"ns/a": model([("p", 1, 20)])})
    history = {("ns/a", "p"): EndpointHistory(flat(4500.0), flat(5000.0))}
    result = plan_round(RoundInput(fleet, history, {("ns/a", "p"): 1}, now_s=10 * DAY))
    e = result.endpoints[("ns/a", "p")]
    # Constant load: last-peak forecaster, 4500 + 0.1 x 5000 = 5000 tokens/s -> 5 instances.
    assert e.region_peak_tps == pytest.approx(5000.0)
    assert e.target == 5
    assert e.current == 1
    assert e.delta == 4
    assert e.forecast_model == "last-peak"
    assert not e.healthy
    assert e.fallback_reason
    assert not e.held
    assert result.solved
    assert result.status == "optimal"
    assert e.cost_per_hour == pytest.approx(5 * 2.0)


def test_a_region_without_data_holds_its_replicas_and_its_pool_space() -> None:
    fleet = FleetSpecs(
        {"p": pool("r", gpus=10)},
        {"ns/a": model([("p", 0, 10)]), "ns/b": model([("p", 0, 10)])},
    )
    history = {
        ("ns/a", "p"): EndpointHistory(Series.of([math.nan] * 12, start_s=9 * DAY)),
        ("ns/b", "p"): EndpointHistory(flat(50_000.0)),
    }
    current = {("ns/a", "p"): 7, ("ns/b", "p"): 1}
    result = plan_round(RoundInput(fleet, history, current, now_s=10 * DAY))
    a, b = result.endpoints[("ns/a", "p")], result.endpoints[("ns/b", "p")]
    assert a.held
    assert a.target == 7
    assert a.region_peak_tps is None
    assert a.forecast_model == "no-data"
    # b wants 50 instances but only the 3 GPUs a does not hold are left.
    assert b.target == 3
    assert any("cannot be served" in line for line in result.binding)
    assert result.held_regions("ns/a") == ["r"]
    assert result.held_regions("ns/b") == []


def test_no_history_at_all_holds_everything_and_solves_nothing() -> None:
    fleet = FleetSpecs({"p": pool("r")}, {"ns/a": model([("p", 2, 5)])})
    result = plan_round(RoundInput(fleet, {}, {("ns/a", "p"): 4}, now_s=1000.0))
    assert result.endpoints[("ns/a", "p")].target == 4
    assert result.plan is None
    assert result.status == "nothing-to-plan"
    assert not result.has_data


def test_reserved_capacity_is_kept_free() -> None:
    fleet = FleetSpecs({"p": pool("r", gpus=8)}, {"ns/a": model([("p", 0, 8)])})
    history = {("ns/a", "p"): EndpointHistory(flat(8000.0))}
    result = plan_round(
        RoundInput(fleet, history, {}, now_s=10 * DAY, reserved={"p": PoolUsage(3, 6)})
    )
    assert result.endpoints[("ns/a", "p")].target == 2


def test_cheaper_pool_wins_and_epsilon_lets_load_move() -> None:
    fleet = FleetSpecs(
        {"east": pool("east", cost=4.0), "west": pool("west", cost=1.0)},
        {"ns/a": model([("east", 0, 10), ("west", 0, 10)], epsilon=0.5, niw_buffer=0.0)},
    )
    history = {
        ("ns/a", "east"): EndpointHistory(flat(4000.0)),
        ("ns/a", "west"): EndpointHistory(flat(1000.0)),
    }
    result = plan_round(RoundInput(fleet, history, {}, now_s=10 * DAY))
    east, west = result.endpoints[("ns/a", "east")], result.endpoints[("ns/a", "west")]
    assert east.target == 2  # epsilon x 4000 must stay local
    assert west.target == 3  # the rest of the 5000 total is served where it is cheap


def test_two_pools_in_one_region_keep_their_own_bounds() -> None:
    fleet = FleetSpecs(
        {"a1": pool("r", cost=1.0), "a2": pool("r", cost=3.0)},
        {"ns/m": model([("a1", 0, 2), ("a2", 1, 10)], niw_buffer=0.0)},
    )
    history = {("ns/m", "a1"): EndpointHistory(flat(6000.0))}  # the region's series, once
    result = plan_round(RoundInput(fleet, history, {}, now_s=10 * DAY))
    a1, a2 = result.endpoints[("ns/m", "a1")], result.endpoints[("ns/m", "a2")]
    assert (a1.target, a2.target) == (2, 4)
    assert a1.region_peak_tps == a2.region_peak_tps == pytest.approx(6000.0)
    assert a1.forecast_peak_tps == pytest.approx(2000.0)
    assert a2.forecast_peak_tps == pytest.approx(4000.0)


def test_a_minimum_the_pool_cannot_hold_is_kept_and_reported() -> None:
    # The held region takes 1 of p's 4 GPUs; b's minimum needs 2 x 2 more. The planner goes one
    # instance short (short_min); the round keeps b's minimum and reports p as overcommitted.
    fleet = FleetSpecs(
        {"p": pool("r", gpus=4)},
        {"ns/a": model([("p", 0, 1)]), "ns/b": model([("p", 2, 2)], gpus=2)},
    )
    history = {("ns/b", "p"): EndpointHistory(flat(9_000.0))}
    current = {("ns/a", "p"): 1, ("ns/b", "p"): 2}
    result = plan_round(RoundInput(fleet, history, current, now_s=10 * DAY))
    a, b = result.endpoints[("ns/a", "p")], result.endpoints[("ns/b", "p")]
    assert a.held
    assert a.target == 1
    assert not b.held
    assert b.target == 2
    assert result.overcommitted == ("p",)
    assert "pool p is overcommitted by minInstances" in result.binding


def test_a_placement_minimum_in_a_full_pool_makes_room_instead_of_overfilling() -> None:
    # The planner only sees a's region bounds (1..2 over both pools): it serves a from `big`
    # and fills `small`'s two slots with b. a's own minimum on `small` then needs a slot there:
    # b gives one up rather than `small` being overfilled (its floor is a single instance).
    fleet = FleetSpecs(
        {"small": pool("r", gpus=4, instances=2, cost=1.0), "big": pool("r", gpus=4, cost=2.0)},
        {"ns/a": model([("big", 0, 1), ("small", 1, 1)]), "ns/b": model([("small", 0, 6)])},
    )
    history = {
        ("ns/a", "big"): EndpointHistory(flat(20_000.0)),
        ("ns/b", "small"): EndpointHistory(flat(20_000.0)),
    }
    current = {("ns/a", "small"): 1, ("ns/b", "small"): 1}
    result = plan_round(RoundInput(fleet, history, current, now_s=10 * DAY))
    targets = {key: e.target for key, e in result.endpoints.items()}
    assert targets == {("ns/a", "big"): 1, ("ns/a", "small"): 1, ("ns/b", "small"): 1}
    assert result.overcommitted == ()
    assert "ns/b: 1 instances fewer in pool small to make room for minInstances" in result.binding


def test_making_room_moves_instances_to_a_sibling_pool_when_it_can() -> None:
    fleet = FleetSpecs(
        {
            "small": pool("r", gpus=4, instances=2, cost=1.0),
            "big": pool("r", gpus=4, cost=2.0),
            "other": pool("r", gpus=4, cost=3.0),
        },
        {
            "ns/a": model([("big", 0, 1), ("small", 1, 1)], niw_buffer=0.0),
            "ns/b": model([("small", 0, 6), ("other", 0, 6)], niw_buffer=0.0),
        },
    )
    history = {
        ("ns/a", "big"): EndpointHistory(flat(2_000.0)),
        ("ns/b", "small"): EndpointHistory(flat(3_000.0)),
    }
    result = plan_round(RoundInput(fleet, history, {}, now_s=10 * DAY))
    targets = {key: e.target for key, e in result.endpoints.items()}
    # a keeps its two instances (one per pool, each at its bounds); b's displaced instance runs
    # in `other`, so both regions' peaks are still served.
    assert targets == {
        ("ns/a", "big"): 1,
        ("ns/a", "small"): 1,
        ("ns/b", "small"): 1,
        ("ns/b", "other"): 2,
    }
    assert result.overcommitted == ()
    assert not any("fewer in pool" in line for line in result.binding)


def test_bad_series_never_raise() -> None:
    fleet = FleetSpecs({"p": pool("r")}, {"ns/a": model([("p", 1, 5)])})
    weird = Series.of([math.inf, -3.0, math.nan, 0.0, 0.0], start_s=9.9 * DAY)
    result = plan_round(
        RoundInput(fleet, {("ns/a", "p"): EndpointHistory(weird, weird)}, {}, now_s=10 * DAY)
    )
    assert result.endpoints[("ns/a", "p")].target == 1


def test_invalid_fleets_raise_a_typed_error() -> None:
    with pytest.raises(FleetPlanError, match="does not exist"):
        plan_round(RoundInput(FleetSpecs({}, {"ns/a": model([("p", 1, 5)])}), {}, {}, 0.0))
    fleet = FleetSpecs({"p": pool("r", gpu_type="TPU")}, {"ns/a": model([("p", 1, 5)])})
    with pytest.raises(FleetPlanError, match="no throughput"):
        plan_round(RoundInput(fleet, {}, {}, 0.0))


def test_forecast_config_takes_the_model_deployments_settings() -> None:
    spec = ModelDeploymentSpec.model_validate(
        {
            "model": {"name": "m"},
            "throughput": {"A100": 1.0},
            "regions": [{"pool": "p", "maxInstances": 1}],
            "scaling": {"forecast": {"horizonSeconds": 1800, "order": [2, 1, 1]}},
        }
    )
    config = forecast_config(spec.scaling.forecast)
    assert config.horizon_s == 1800.0
    assert config.orders == ((2, 1, 1),)


def test_sum_series_keeps_a_slot_missing_only_when_every_series_is() -> None:
    a = Series.of([1.0, math.nan, math.nan], start_s=0.0)
    b = Series.of([2.0, 3.0, math.nan], start_s=0.0)
    total = sum_series([a, b])
    assert total is not None
    assert total.values[:2] == (3.0, 3.0)
    assert math.isnan(total.values[2])
    shifted = sum_series([a, Series.of([5.0], start_s=300.0)])
    assert shifted is not None
    assert shifted.values[:2] == (1.0, 5.0)


@st.composite
def fleets(draw: st.DrawFn) -> tuple[RoundInput, dict[str, RegionPoolSpec]]:
    n_pools = draw(st.integers(1, 3))
    pools = {
        f"p{q}": pool(
            f"r{draw(st.integers(0, 1))}",
            gpus=draw(st.integers(4, 40)),
            instances=draw(st.one_of(st.none(), st.integers(2, 20))),
            cost=draw(st.floats(0.5, 5.0)),
        )
        for q in range(n_pools)
    }
    mds: dict[str, ModelDeploymentSpec] = {}
    history: dict[tuple[str, str], EndpointHistory] = {}
    current: dict[tuple[str, str], int] = {}
    for i in range(draw(st.integers(1, 3))):
        used = draw(
            st.lists(st.sampled_from(sorted(pools)), min_size=1, max_size=n_pools, unique=True)
        )
        regions = []
        for name in used:
            lo = draw(st.integers(0, 2))
            regions.append((name, lo, max(1, lo + draw(st.integers(0, 6)))))
        key = f"ns/m{i}"
        mds[key] = model(
            regions,
            throughput=draw(st.floats(100.0, 2000.0)),
            gpus=draw(st.integers(1, 2)),
            epsilon=draw(st.floats(0.3, 1.0)),
        )
        for name, lo, hi in regions:
            current[(key, name)] = draw(st.integers(lo, hi))
            kind = draw(st.sampled_from(["none", "nan", "flat", "diurnal"]))
            if kind == "nan":
                history[(key, name)] = EndpointHistory(Series.of([math.nan] * 6, start_s=9 * DAY))
            elif kind == "flat":
                history[(key, name)] = EndpointHistory(flat(draw(st.floats(0, 20_000)), hours=3))
            elif kind == "diurnal":
                history[(key, name)] = EndpointHistory(diurnal(5000, 4000, hours=30))
    return RoundInput(FleetSpecs(pools, mds), history, current, now_s=10 * DAY), pools


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_properties_bounds_capacity_and_held_regions(
    case: tuple[RoundInput, dict[str, RegionPoolSpec]],
) -> None:
    inp, pools = case
    result = plan_round(inp)
    by_pool_gpus: dict[str, int] = {}
    by_pool_slots: dict[str, int] = {}
    for (md, name), e in result.endpoints.items():
        spec = inp.fleet.model_deployments[md]
        placement = next(p for p in spec.regions if p.pool == name)
        assert placement.min_instances <= e.target <= placement.max_instances
        if e.held:
            assert e.target == inp.current[(md, name)]
        by_pool_gpus[name] = by_pool_gpus.get(name, 0) + e.target * spec.model.gpus_per_instance
        by_pool_slots[name] = by_pool_slots.get(name, 0) + e.target
    feasible = result.plan is not None and result.plan.has_plan and not result.plan.short_min
    held_fit = all(
        sum(
            e.target * inp.fleet.model_deployments[e.model_deployment].model.gpus_per_instance
            for e in result.endpoints.values()
            if e.pool == name and e.held
        )
        <= (p.capacity.gpus or 10**9)
        and sum(e.target for e in result.endpoints.values() if e.pool == name and e.held)
        <= (p.capacity.instances or 10**9)
        for name, p in pools.items()
    )
    if feasible and held_fit:
        for name, p in pools.items():
            if name in result.overcommitted:
                # Only when the minimums (and held regions) alone do not fit the pool.
                floor = [
                    (e.target if e.held else e_min, gpus)
                    for e, e_min, gpus in _on_pool(inp, result, name)
                ]
                assert sum(n * g for n, g in floor) > (p.capacity.gpus or 10**9) or sum(
                    n for n, _ in floor
                ) > (p.capacity.instances or 10**9)
                continue
            if p.capacity.gpus is not None:
                assert by_pool_gpus.get(name, 0) <= p.capacity.gpus
            if p.capacity.instances is not None:
                assert by_pool_slots.get(name, 0) <= p.capacity.instances


def _on_pool(
    inp: RoundInput, result: RoundResult, pool: str
) -> list[tuple[EndpointPlan, int, int]]:
    """(plan, minInstances, GPUs per instance) of every endpoint on `pool`."""
    out = []
    for e in result.endpoints.values():
        if e.pool != pool:
            continue
        spec = inp.fleet.model_deployments[e.model_deployment]
        placement = next(p for p in spec.regions if p.pool == pool)
        out.append((e, placement.min_instances, spec.model.gpus_per_instance))
    return out
