"""Instance lifecycle in the fleet simulator: load times, spot reclaim, drain, pool capacity."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetwarden.api.enums import Tier
from fleetwarden.sim.cluster import SimOptions, simulate
from fleetwarden.sim.profiles import VTC_A10G
from fleetwarden.sim.results import SimResults
from fleetwarden.sim.workload import SimRequest
from tests.sim.fleet_fixtures import model_yaml, pool_yaml, write_fleet

KEY = ("ns/m", "pool-a")


def _steady(rate: float, until: float, start: float = 0.0, tokens: tuple[int, int] = (400, 200)):  # type: ignore[no-untyped-def]
    n = int((until - start) * rate)
    return [
        SimRequest(start + i / rate, "org/m", "region-a", f"t{i % 3}", *tokens, tier=Tier.IW_NORMAL)
        for i in range(n)
    ]


def _run(fleet_dir: Path, docs: list[str], workload: list[SimRequest], **options) -> SimResults:  # type: ignore[no-untyped-def]
    fleet = write_fleet(fleet_dir, *docs)
    options.setdefault("profiles", {KEY: VTC_A10G})
    options.setdefault("keep_requests", True)
    return simulate(fleet, workload, SimOptions(**options))


def _events(results: SimResults, step: int) -> list[list[object]]:
    return [e for e in results.series["events"] if e[2] == step]


def test_new_instances_serve_only_after_the_model_load_time(tmp_path: Path) -> None:
    scaling = "    strategy: reactive\n    cooldownSeconds: 15"
    docs = [pool_yaml(load_s=600), model_yaml(regions=(("pool-a", 1, 3),), scaling=scaling)]
    results = _run(tmp_path, docs, _steady(6.0, 1500), duration_s=1500.0)
    launches = _events(results, +1)
    # Saturated: one launch; the loading instance counts as capacity, so the next launch waits
    # until it is ready (615 s) and the region, still saturated, asks again at the next tick.
    assert [e[0] for e in launches] == [15.0, 630.0]
    assert [e[5] for e in launches] == [615.0, 1230.0]
    assert results.requests is not None
    for _, _, _, _, iid, ready in launches:
        served = [r.dispatch_s for r in results.requests if r.instance == iid]
        assert served, "the new instance serves once it is ready"
        assert min(d for d in served if d is not None) >= ready
    stats = results.endpoints["ns/m/pool-a"]
    assert stats.launches == 2
    assert stats.cold_start_gpu_hours == pytest.approx(2 * 600 / 3600)
    # 1 warm instance for 1500 s, two more from 15 s and 630 s
    assert stats.instance_hours == pytest.approx((1500 + 1485 + 870) / 3600)
    assert stats.cost == pytest.approx(stats.gpu_hours * 2.0)


def test_scaled_in_instances_drain_their_work_then_stop(tmp_path: Path) -> None:
    # scale-in below 0.95: the first tick removes an instance that is busy
    scaling = (
        "    strategy: reactive\n    scaleOutUtilization: 1.0\n    scaleInUtilization: 0.95\n"
        "    cooldownSeconds: 15"
    )
    docs = [pool_yaml(), model_yaml(regions=(("pool-a", 1, 2),), scaling=scaling)]
    results = _run(tmp_path, docs, _steady(4.0, 300), duration_s=300.0, initial_instances={KEY: 2})
    (removal,) = _events(results, -1)
    assert removal[0] == 15.0
    assert results.requests is not None
    mine = [r for r in results.requests if r.instance == removal[4]]
    assert mine
    assert all(r.outcome == "completed" for r in mine)
    assert max(r.arrival_s for r in mine) <= 15.0  # nothing routed to it after the removal
    last = max(r.completion_s for r in mine if r.completion_s is not None)
    assert last > 15.0  # it finished its work after being removed
    stats = results.endpoints["ns/m/pool-a"]
    assert stats.instance_hours == pytest.approx((300 + last) / 3600)


def test_reclaiming_a_donated_spot_instance_takes_a_minute(tmp_path: Path) -> None:
    # SageServe's spot donation: opt-in, and only where the pool and the model allow spot
    scaling = "    strategy: reactive\n    cooldownSeconds: 15"
    niw_spot = "  niw:\n    spot:\n      enabled: true\n"
    model = model_yaml(regions=(("pool-a", 1, 2),), scaling=scaling) + niw_spot
    docs = [pool_yaml(spot=True), model]
    # idle at first (scale-in to 1, donated), then a load that needs two instances
    workload = _steady(6.0, 900, start=120.0)
    results = _run(
        tmp_path,
        docs,
        workload,
        duration_s=900.0,
        initial_instances={KEY: 2},
        spot_donation=True,
    )
    removal = _events(results, -1)[0]
    launch = _events(results, +1)[0]
    assert removal[0] == 15.0
    assert launch[5] == pytest.approx(launch[0] + 60.0)
    stats = results.endpoints["ns/m/pool-a"]
    assert stats.reclaims == 1
    assert stats.donated_instance_hours == pytest.approx((launch[0] - 15.0) / 3600)
    assert stats.cold_start_gpu_hours == pytest.approx(60.0 / 3600)


def test_a_full_pool_blocks_scale_out(tmp_path: Path) -> None:
    scaling = "    strategy: reactive\n    cooldownSeconds: 15"
    docs = [pool_yaml(gpus=1), model_yaml(regions=(("pool-a", 1, 3),), scaling=scaling)]
    results = _run(tmp_path, docs, _steady(6.0, 300), duration_s=300.0)
    stats = results.endpoints["ns/m/pool-a"]
    assert stats.launches == 0
    assert stats.blocked_scale_out > 0


def test_loading_instances_are_cancelled_first_on_scale_in(tmp_path: Path) -> None:
    scaling = "    strategy: reactive\n    cooldownSeconds: 15"
    docs = [pool_yaml(), model_yaml(regions=(("pool-a", 1, 3),), scaling=scaling)]
    # a short burst triggers a launch; the idle fleet then scales in while it still loads
    results = _run(tmp_path, docs, _steady(8.0, 14), duration_s=200.0)
    launches, removals = _events(results, +1), _events(results, -1)
    assert launches
    assert removals
    assert removals[0][4] == launches[-1][4]  # the loading instance went first
    stats = results.endpoints["ns/m/pool-a"]
    wasted = sum(gone[0] - new[0] for new, gone in zip(launches, removals, strict=False))
    assert stats.cold_start_gpu_hours == pytest.approx(wasted / 3600)
