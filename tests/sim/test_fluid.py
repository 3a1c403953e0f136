"""The fluid simulator: determinism, lifecycle timing, strategies, agreement with request-level."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from fleetwarden.api.enums import ScalingStrategy, Tier
from fleetwarden.sim.cluster import SimOptions, simulate
from fleetwarden.sim.fleet_spec import Fleet, load_fleet
from fleetwarden.sim.fluid import simulate_fluid
from fleetwarden.sim.fluid_rates import BinnedRates, BuiltinRates, Lengths, StepRates
from fleetwarden.sim.fluid_service import ServiceModel
from fleetwarden.sim.profiles import VTC_A10G
from fleetwarden.sim.workload import SimRequest
from fleetwarden.sim.workload_builtin import BuiltinWorkload
from tests.sim.fleet_fixtures import model_yaml, pool_yaml, write_fleet

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KEY = ("ns/m", "pool-a")


class ConstantRates:
    """A constant interactive load on one stream."""

    def __init__(self, iw_tps: float, niw_tps: float = 0.0) -> None:
        self.step = StepRates(0.0, iw_tps, niw_tps)

    def rates(self, t0: float, t1: float) -> dict[tuple[str, str], StepRates]:
        return {("org/m", "region-a"): self.step}

    def lengths(self, model: str) -> Lengths:
        return Lengths(400.0, 200.0)


def _one_pool(tmp_path: Path, scaling: str, *, spot: bool = False, hi: int = 3) -> Fleet:
    return write_fleet(
        tmp_path,
        pool_yaml(load_s=600, spot=spot),
        model_yaml(regions=(("pool-a", 1, hi),), scaling=scaling),
    )


def test_same_inputs_give_the_same_json() -> None:
    fleet = load_fleet(EXAMPLES)
    options = SimOptions(duration_s=6 * 3600.0, strategy=ScalingStrategy.LT_UA)
    first = simulate_fluid(
        fleet, BuiltinRates(BuiltinWorkload(duration_s=6 * 3600.0), fleet), options
    )
    second = simulate_fluid(
        fleet, BuiltinRates(BuiltinWorkload(duration_s=6 * 3600.0), fleet), options
    )
    assert first.to_json() == second.to_json()
    assert first.meta["fidelity"] == "fluid"


def test_new_instances_serve_only_after_the_model_load_time(tmp_path: Path) -> None:
    fleet = _one_pool(tmp_path, "    strategy: reactive\n    cooldownSeconds: 15")
    # 3x one instance's throughput: saturated from the start
    results = simulate_fluid(
        fleet, ConstantRates(3 * 2000.0), SimOptions(duration_s=1500.0, profiles={KEY: VTC_A10G})
    )
    launches = [e for e in results.series["events"] if e[2] == 1]
    # The first step has no utilisation yet; from the second, one launch, and the next only once
    # it is ready (a loading instance counts as capacity), the region being still saturated.
    assert [e[0] for e in launches] == [60.0, 660.0]
    assert [e[5] for e in launches] == [660.0, 1260.0]
    ready = {row[0]: row[1] for row in results.series["samples"]["ns/m/pool-a"]}
    assert ready[600.0] == 1  # still loading
    assert ready[660.0] == 2  # ready at 660: serves this step
    assert ready[1260.0] == 3
    stats = results.endpoints["ns/m/pool-a"]
    assert stats.cold_start_gpu_hours == pytest.approx(2 * 600 / 3600)
    assert stats.instance_hours == pytest.approx((1500 + 1440 + 840) / 3600)


def test_a_donated_spot_instance_is_reclaimed_in_a_minute(tmp_path: Path) -> None:
    # SageServe's spot donation: opt-in, and only where the pool and the model allow spot
    scaling = "    strategy: reactive\n    cooldownSeconds: 15"
    niw_spot = "  niw:\n    spot:\n      enabled: true\n"
    model = model_yaml(regions=(("pool-a", 1, 2),), scaling=scaling) + niw_spot
    fleet = write_fleet(tmp_path, pool_yaml(load_s=600, spot=True), model)
    # Idle at first (scale in to 1, donating one), then saturated: the relaunch is a reclaim.
    rates = BinnedRates.from_requests(
        [
            SimRequest(600.0 + i * 0.05, "org/m", "region-a", "t", 400, 200, tier=Tier.IW_NORMAL)
            for i in range(12_000)
        ],
        fleet,
    )
    results = simulate_fluid(
        fleet,
        rates,
        SimOptions(
            duration_s=1200.0,
            profiles={KEY: VTC_A10G},
            initial_instances={KEY: 2},
            spot_donation=True,
        ),
    )
    events = results.series["events"]
    out = [e for e in events if e[2] == 1]
    assert [e[2] for e in events][:1] == [-1]
    assert out
    assert out[0][5] == pytest.approx(out[0][0] + 60.0)
    assert results.endpoints["ns/m/pool-a"].reclaims >= 1


def test_lt_ua_uses_no_more_instance_hours_than_reactive_on_a_diurnal_load() -> None:
    fleet = load_fleet(EXAMPLES)
    hours: dict[ScalingStrategy, float] = {}
    for strategy in (ScalingStrategy.REACTIVE, ScalingStrategy.LT_UA):
        rates = BuiltinRates(BuiltinWorkload(duration_s=86_400.0), fleet)
        results = simulate_fluid(fleet, rates, SimOptions(duration_s=86_400.0, strategy=strategy))
        hours[strategy] = results.totals["instance_hours"]
        cold = results.totals["cold_start_gpu_hours"]
        assert cold >= 0
    assert hours[ScalingStrategy.LT_UA] <= hours[ScalingStrategy.REACTIVE]


def test_fluid_and_request_level_agree_on_a_static_fleet(tmp_path: Path) -> None:
    fleet = write_fleet(tmp_path, pool_yaml(), model_yaml(regions=(("pool-a", 2, 2),)))
    requests = [
        SimRequest(i * 0.5, "org/m", "region-a", f"t{i % 3}", 400, 200, tier=Tier.IW_NORMAL)
        for i in range(2400)
    ]
    options = SimOptions(duration_s=1200.0, scaling=False, profiles={KEY: VTC_A10G})
    exact = simulate(fleet, requests, options)
    fluid = simulate_fluid(fleet, BinnedRates.from_requests(requests, fleet), options)
    assert fluid.totals["gpu_hours"] == pytest.approx(exact.totals["gpu_hours"])
    assert fluid.totals["instance_hours"] == pytest.approx(exact.totals["instance_hours"])
    # light load: both serve (nearly) everything, the fluid counts within rounding
    assert fluid.totals["requests"] == pytest.approx(exact.totals["requests"], rel=0.01)
    assert fluid.totals["completed"] == pytest.approx(exact.totals["completed"], rel=0.02)


def test_kv_utilisation_grows_with_load_and_saturates() -> None:
    service = ServiceModel(2000.0, VTC_A10G, 400.0, 200.0)
    values = [service.kv_utilisation(rho / 10) for rho in range(0, 11)]
    assert values[0] == 0.0
    assert all(a <= b for a, b in pairwise(values))
    assert service.kv_utilisation(5.0) == 1.0
    assert service.ttft_s(0.9, 0.0, 1.0) > service.ttft_s(0.1, 0.0, 1.0)
