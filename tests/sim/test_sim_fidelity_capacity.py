"""The simulator's capacity and routing figures mean what the operator's would.

- Spot donation (SageServe's, which the operator does not implement) is off unless asked for,
  and when asked for it follows the ModelDeployment's `niw.spot` as well as the pool's spot.
- `static` pins `maxInstances` only as far as the pool holds, placing ModelDeployments in the
  operator's first-come order, and says which endpoints got fewer.
- `spilled` counts every request served outside its home region.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetwarden.api.enums import Tier
from fleetwarden.cli import build_parser
from fleetwarden.operator.allocation import Demand, account
from fleetwarden.sim.cluster import SimOptions, simulate
from fleetwarden.sim.fleet_spec import Fleet
from fleetwarden.sim.profiles import VTC_A10G
from fleetwarden.sim.results import SimResults
from fleetwarden.sim.run import RunSpec, options_for, run_one
from fleetwarden.sim.static_capacity import static_placement
from fleetwarden.sim.workload import SimRequest
from fleetwarden.sim.workload_builtin import BuiltinWorkload
from tests.sim.fleet_fixtures import model_yaml, pool_yaml, write_fleet

KEY = ("ns/m", "pool-a")


# -- spot donation ---------------------------------------------------------------------------------


def _idle_then_busy(tmp_path: Path, niw_spot: str, **options: object) -> SimResults:
    """Two instances, idle at first (scale-in to one), then a load that needs two again."""
    scaling = "    strategy: reactive\n    cooldownSeconds: 15"
    model = model_yaml(regions=(("pool-a", 1, 2),), scaling=scaling) + niw_spot
    fleet = write_fleet(tmp_path, pool_yaml(spot=True), model)
    workload = [
        SimRequest(120.0 + i / 6.0, "org/m", "region-a", f"t{i % 3}", 400, 200, tier=Tier.IW_NORMAL)
        for i in range(int(780 * 6.0))
    ]
    return simulate(
        fleet,
        workload,
        SimOptions(
            duration_s=900.0, profiles={KEY: VTC_A10G}, initial_instances={KEY: 2}, **options
        ),  # type: ignore[arg-type]
    )


def _relaunch_load_s(results: SimResults) -> float:
    launch = next(e for e in results.series["events"] if e[2] == 1)
    return float(launch[5]) - float(launch[0])


SPOT_ON = "  niw:\n    spot:\n      enabled: true\n"


def test_spot_donation_is_off_by_default(tmp_path: Path) -> None:
    """Pool and ModelDeployment both allow spot, but the operator has no donate-and-reclaim
    path: the relaunch loads the model for modelLoadSeconds (600 s), nothing is donated."""
    results = _idle_then_busy(tmp_path, SPOT_ON)
    stats = results.endpoints["ns/m/pool-a"]
    assert _relaunch_load_s(results) == 600.0
    assert (stats.reclaims, stats.donated_instance_hours) == (0, 0.0)
    assert all(row[6] == 0 for row in results.series["samples"]["ns/m/pool-a"])


@pytest.mark.parametrize(
    ("niw_spot", "reclaims"),
    [
        ("", 0),  # the ModelDeployment's niw.spot is off (the default)
        ("  niw:\n    spot:\n      enabled: true\n      maxInstances: 0\n", 0),
        (SPOT_ON, 1),
    ],
    ids=["model-spot-off", "model-spot-cap-0", "model-spot-on"],
)
def test_spot_donation_on_follows_the_model_deployments_niw_spot(
    tmp_path: Path, niw_spot: str, reclaims: int
) -> None:
    results = _idle_then_busy(tmp_path, niw_spot, spot_donation=True)
    assert results.endpoints["ns/m/pool-a"].reclaims == reclaims
    assert _relaunch_load_s(results) == (60.0 if reclaims else 600.0)


def test_the_cli_flag_reaches_the_run_options(tmp_path: Path) -> None:
    parser = build_parser()
    assert parser.parse_args(["simulate"]).spot_donation is False
    assert parser.parse_args(["simulate", "--spot-donation"]).spot_donation is True
    fleet = write_fleet(tmp_path, pool_yaml(spot=True), model_yaml() + SPOT_ON)
    workload = BuiltinWorkload(duration_s=60.0)
    spec = RunSpec((tmp_path,), workload, 60.0, spot_donation=True)
    assert options_for(spec, "reactive", fleet).spot_donation is True
    assert options_for(RunSpec((tmp_path,), workload, 60.0), "lt-u", fleet).spot_donation is False


# -- static on a pool too small --------------------------------------------------------------------


def _shared_pool(tmp_path: Path, big_first: bool) -> Fleet:
    """A 16-GPU pool; `big` wants 8 x 4 GPUs, `small` 8 x 1 GPU (40 GPUs at maxInstances)."""

    def md(name: str, gpus: int, created: str) -> str:
        text = model_yaml(name, regions=(("pool-a", 1, 8),))
        text = text.replace(
            "  namespace: ns\n", f"  namespace: ns\n  creationTimestamp: '{created}'\n"
        )
        return text.replace(
            f"    name: org/{name}\n", f"    name: org/{name}\n    gpusPerInstance: {gpus}\n"
        )

    early, late = "2024-01-01T00:00:00Z", "2024-02-01T00:00:00Z"
    return write_fleet(
        tmp_path,
        pool_yaml(gpus=16),
        md("big", 4, early if big_first else late),
        md("small", 1, late if big_first else early),
    )


def _operator_shortfalls(fleet: Fleet) -> set[str]:
    """The ModelDeployments the operator's pool accounting says do not fit at maxInstances."""
    demands = [
        Demand(m.key, m.created, p.pool, p.max_instances, p.gpus_per_instance)
        for m in fleet.models.values()
        for p in m.placements
    ]
    pools = {name: pool.spec for name, pool in fleet.pools.items()}
    return {s.model_deployment for s in account(pools, demands).shortfalls}


@pytest.mark.parametrize(
    ("big_first", "pinned"),
    [(True, {"ns/big": 4, "ns/small": 0}), (False, {"ns/big": 2, "ns/small": 8})],
)
def test_static_pins_what_the_pool_holds_in_creation_order(
    tmp_path: Path, big_first: bool, pinned: dict[str, int]
) -> None:
    fleet = _shared_pool(tmp_path, big_first)
    placement = static_placement(fleet)
    assert {k[0]: n for k, n in placement.instances.items()} == pinned
    short = {k for k, n in pinned.items() if n < 8}
    assert short == _operator_shortfalls(fleet)
    assert len(placement.shortfalls) == len(short)
    for name in short:
        assert any(name in note and "pool-a" in note for note in placement.shortfalls)


def test_a_static_run_is_billed_for_the_pool_and_says_what_it_left_out(tmp_path: Path) -> None:
    _shared_pool(tmp_path, big_first=True)
    spec = RunSpec((tmp_path,), BuiltinWorkload(duration_s=600.0, rate_scale=0.01), 600.0)
    run = json.loads(run_one(spec, "static"))
    gpu_hours = sum(e["gpu_hours"] for e in run["endpoints"].values())
    assert gpu_hours == pytest.approx(16 * 600.0 / 3600.0)  # the pool's 16 GPUs, not 40
    notes = run["meta"]["capacityShortfalls"]
    assert len(notes) == 2
    assert "pinned at 4 of its 8 maxInstances" in notes[0]
    assert "pinned at 0 of its 8 maxInstances" in notes[1]
    scaled = json.loads(run_one(spec, "lt-u"))
    assert scaled["meta"]["capacityShortfalls"] == []


# -- spilled ---------------------------------------------------------------------------------------


def test_a_request_served_outside_its_region_is_spilled_whatever_the_route(
    tmp_path: Path,
) -> None:
    """region-a has no ready instance: its requests go to region-b's least-loaded instance (the
    router's last resort). They left their region, so they count as spilled, as those that
    spill for lack of room do."""
    fleet = write_fleet(
        tmp_path,
        pool_yaml("pool-a", "region-a"),
        pool_yaml("pool-b", "region-b"),
        model_yaml(regions=(("pool-a", 0, 1), ("pool-b", 1, 1)), scaling="    epsilon: 0.5"),
    )
    workload = [
        SimRequest(0.001 * i, "org/m", "region-a", "t", 4000, 1000, tier=Tier.IW_NORMAL)
        for i in range(4)
    ]
    options = SimOptions(
        duration_s=3600.0,
        scaling=False,
        profiles={KEY: VTC_A10G, ("ns/m", "pool-b"): VTC_A10G},
        initial_instances={KEY: 0},
        keep_requests=True,
    )
    results = simulate(fleet, workload, options)
    assert results.requests is not None
    assert [(r.pool, r.spilled) for r in results.requests] == [("pool-b", True)] * 4
    assert results.totals["spilled"] == 4
