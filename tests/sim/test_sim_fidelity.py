"""The simulator decides as the operator does (DESIGN section 3, "one brain, two bodies").

Each test pins one place where the simulator used to diverge from the operator, and where it can,
asks the operator's own `Autoscaler` the same question:

- a region at 0 instances: the scalers are built with the operator's `leave_zero_toward_target`
  (the plan brings the region back), and no utilisation is invented for it (no pod, no reading:
  with a plan of 0 the region stays at 0, as in production);
- the plan period is the operator's (the fleet's shortest `horizonSeconds`), and LT-UA's last
  window follows it;
- scaling is evaluated at each 15 s metrics poll with the cooldown inside the scaler, and a
  reading observed before the last step cannot move the region again.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fleetwarden.api.enums import ScalingStrategy, Tier
from fleetwarden.operator.autoscaler import Autoscaler, RegionPlan, RegionSignal
from fleetwarden.operator.hourly_planner import period_of
from fleetwarden.scaling.config import METRICS_POLL_INTERVAL_S
from fleetwarden.sim.cluster import FleetSimulation, SimOptions, simulate
from fleetwarden.sim.fleet_spec import Fleet, Model
from fleetwarden.sim.forecast_planner import fleet_specs
from fleetwarden.sim.plan_period import plan_period_s
from fleetwarden.sim.planning import EndpointKey, LastHourPeakPlanner, LoadHistory, PlanEntry
from fleetwarden.sim.profiles import VTC_A10G
from fleetwarden.sim.run import RunSpec, options_for
from fleetwarden.sim.scaling_tick import scaling_tick
from fleetwarden.sim.workload import SimRequest
from fleetwarden.sim.workload_builtin import BuiltinWorkload
from tests.sim.fleet_fixtures import model_yaml, pool_yaml, write_fleet


class FixedPlanner:
    """Plans `targets[pool]` for the endpoints on those pools, the current count elsewhere."""

    def __init__(self, targets: Mapping[str, int]) -> None:
        self.targets = dict(targets)

    def plan(
        self,
        now_s: float,
        fleet: Fleet,
        history: Mapping[EndpointKey, LoadHistory],
        current: Mapping[EndpointKey, int],
    ) -> Mapping[EndpointKey, PlanEntry]:
        return {key: PlanEntry(self.targets.get(key[1], current[key]), None) for key in history}


def _requests(count: int, region: str, gap_s: float = 1.0) -> list[SimRequest]:
    return [
        SimRequest(1.0 + i * gap_s, "org/m", region, "t", 400, 200, tier=Tier.IW_NORMAL)
        for i in range(count)
    ]


def _events(results_events: list[list[object]], endpoint: str) -> list[list[object]]:
    return [e for e in results_events if e[1] == endpoint]


def _operator_step(
    model: Model, pool: str, current: int, plan: RegionPlan | None, signal: RegionSignal | None
) -> tuple[int, str] | None:
    """What the operator's `Autoscaler` decides for one region at 15 s: (step, reason)."""
    autoscaler = Autoscaler()
    key = (model.key, pool)
    if plan is not None:
        autoscaler.plans[key] = plan
    if signal is not None:
        autoscaler.signals[key] = signal
    placement = next(p for p in model.spec.regions if p.pool == pool)
    step = autoscaler.step(model.key, model.spec, placement, current=current, now_s=15.0)
    return None if step is None else (step.decision.step, step.decision.reason.value)


# -- a region at 0 instances -----------------------------------------------------------------------


def test_a_region_at_zero_steps_toward_its_plan_without_a_reading(tmp_path: Path) -> None:
    """pool-a (minInstances 0) starts empty and its requests spill to region-b, so nothing ever
    waits there: only the plan (target 2) can bring it back, as the operator's leave-zero step
    does. Before, the simulator's scalers lacked the operator's flag and pool-a stayed at 0."""
    scaling = "    strategy: lt-i\n    cooldownSeconds: 15\n    epsilon: 0.5"
    fleet = write_fleet(
        tmp_path,
        pool_yaml("pool-a", "region-a"),
        pool_yaml("pool-b", "region-b"),
        model_yaml(regions=(("pool-a", 0, 2), ("pool-b", 1, 2)), scaling=scaling),
    )
    options = SimOptions(
        duration_s=300.0,
        planner=FixedPlanner({"pool-a": 2, "pool-b": 1}),
        profiles={("ns/m", "pool-a"): VTC_A10G, ("ns/m", "pool-b"): VTC_A10G},
        initial_instances={("ns/m", "pool-a"): 0},
    )
    results = simulate(fleet, _requests(20, "region-a", 5.0), options)
    events = _events(results.series["events"], "ns/m/pool-a")
    assert [e[:4] for e in events] == [[15.0, "ns/m/pool-a", 1, "toward-target"]]
    assert results.totals["spilled"] == 20  # nothing waited at pool-a's region
    # the operator, same facts: 0 replicas, a plan of 2, no reading (no pod, no series)
    operator = _operator_step(fleet.models["ns/m"], "pool-a", 0, RegionPlan(2, None), None)
    assert operator == (1, "toward-target")


def test_requests_waiting_at_an_empty_region_are_no_reading(tmp_path: Path) -> None:
    """Requests wait at a region with no instance and a plan of 0. The operator has no reading
    there (no pod reports utilisation) and holds; the simulator used to invent a utilisation
    of 1.0 from the waiting requests and scale out. Now it holds as well."""
    scaling = "    strategy: reactive\n    cooldownSeconds: 15"
    fleet = write_fleet(
        tmp_path, pool_yaml(load_s=60), model_yaml(regions=(("pool-a", 0, 2),), scaling=scaling)
    )
    options = SimOptions(
        duration_s=300.0,
        planner=FixedPlanner({"pool-a": 0}),
        profiles={("ns/m", "pool-a"): VTC_A10G},
        initial_instances={("ns/m", "pool-a"): 0},
    )
    results = simulate(fleet, _requests(10, "region-a"), options)
    assert results.series["events"] == []
    assert results.totals["completed"] == 0
    assert _operator_step(fleet.models["ns/m"], "pool-a", 0, RegionPlan(0, None), None) is None


# -- the plan period -------------------------------------------------------------------------------


def _two_horizons(tmp_path: Path) -> Fleet:
    short = "    strategy: lt-ua\n    forecast:\n      horizonSeconds: 1800"
    return write_fleet(
        tmp_path,
        pool_yaml(),
        model_yaml("a", regions=(("pool-a", 1, 2),), scaling=short),
        model_yaml("b", regions=(("pool-a", 1, 2),)),
    )


def test_the_plan_period_is_the_fleets_shortest_horizon_as_the_operator_plans(
    tmp_path: Path,
) -> None:
    fleet = _two_horizons(tmp_path)
    assert plan_period_s(fleet) == period_of(fleet_specs(fleet)) == 1800.0
    spec = RunSpec((tmp_path,), BuiltinWorkload(duration_s=7200.0), 7200.0)
    options = options_for(spec, "lt-ua", fleet)
    assert options.period_s == 1800.0
    assert isinstance(options.planner, LastHourPeakPlanner)
    sim = FleetSimulation(fleet, [], options)
    for endpoint in sim.endpoints.values():
        assert endpoint.scaler is not None
        config = endpoint.scaler.config
        # LT-UA's last window is the last 20 minutes of the 30-minute period: from minute 10
        assert (config.period_s, config.last_window_s) == (1800.0, 1200.0)
        assert config.in_last_window(1000.0)
        assert config.in_last_window(2800.0)
        assert not config.in_last_window(1900.0)
    results = sim.run()
    assert results.meta["periodSeconds"] == 1800.0
    for rows in results.series["plans"].values():
        assert [row[0] for row in rows] == [0.0, 1800.0, 3600.0, 5400.0]


# -- when scaling is evaluated ---------------------------------------------------------------------


def _walk(tmp_path: Path, cooldown_s: int) -> tuple[Fleet, list[float]]:
    """LT-I from 1 to a plan of 6 on an idle region: the times of its scaling events."""
    scaling = f"    strategy: lt-i\n    cooldownSeconds: {cooldown_s}"
    fleet = write_fleet(
        tmp_path, pool_yaml(load_s=0), model_yaml(regions=(("pool-a", 1, 6),), scaling=scaling)
    )
    options = SimOptions(
        duration_s=400.0,
        planner=FixedPlanner({"pool-a": 6}),
        profiles={("ns/m", "pool-a"): VTC_A10G},
    )
    results = simulate(fleet, [], options)
    return fleet, [float(e[0]) for e in results.series["events"]]


def _operator_walk(fleet: Fleet, end_s: float) -> list[float]:
    """The operator on the same facts: a fresh reading every metrics poll, one reconcile each."""
    model = fleet.models["ns/m"]
    placement = model.spec.regions[0]
    autoscaler = Autoscaler()
    key = (model.key, placement.pool)
    autoscaler.plans[key] = RegionPlan(6, None, 3600.0)
    current, times, t = 1, [], METRICS_POLL_INTERVAL_S
    while t < end_s:
        autoscaler.signals[key] = RegionSignal(observed_s=t, utilisation=0.0, load_tps=0.0)
        step = autoscaler.step(model.key, model.spec, placement, current=current, now_s=t)
        if step is not None and step.after != step.before:
            times.append(t)
            current = step.after
        t += METRICS_POLL_INTERVAL_S
    return times


def test_a_cooldown_shorter_than_the_poll_waits_for_the_next_poll(tmp_path: Path) -> None:
    """cooldownSeconds 5: the operator can still step only once per 15 s poll."""
    fleet, times = _walk(tmp_path, 5)
    assert times == [15.0, 30.0, 45.0, 60.0, 75.0]
    assert times == _operator_walk(fleet, 400.0)


def test_a_cooldown_longer_than_the_poll_acts_at_the_first_poll_after_it(tmp_path: Path) -> None:
    """cooldownSeconds 40: the next step comes at the first poll at least 40 s later (60, not
    55 or 80), since the cooldown is the scaler's and the tick is the poll."""
    fleet, times = _walk(tmp_path, 40)
    assert times == [15.0, 60.0, 105.0, 150.0, 195.0]
    assert times == _operator_walk(fleet, 400.0)


def test_a_reading_observed_before_the_last_step_does_not_move_the_region(tmp_path: Path) -> None:
    scaling = "    strategy: lt-i\n    cooldownSeconds: 15"
    fleet = write_fleet(
        tmp_path, pool_yaml(), model_yaml(regions=(("pool-a", 1, 6),), scaling=scaling)
    )
    options = SimOptions(strategy=ScalingStrategy.LT_I, profiles={("ns/m", "pool-a"): VTC_A10G})
    sim = FleetSimulation(fleet, [], options)
    endpoint = sim.endpoints["ns/m", "pool-a"]
    sim._launch(endpoint, 0.0, warm=True)
    endpoint.target = 6
    pool = sim.by_pool["pool-a"]
    events: list[list[object]] = []
    assert scaling_tick(endpoint, 100.0, 0.0, None, pool, sim._launch, events) == 15.0
    assert [e[0] for e in events] == [100.0]  # the reading taken at the tick itself
    # a reading observed at 100 s (before or at the step) cannot justify a second one
    scaling_tick(endpoint, 200.0, 0.0, None, pool, sim._launch, events, observed_s=100.0)
    assert [e[0] for e in events] == [100.0]
    scaling_tick(endpoint, 215.0, 0.0, None, pool, sim._launch, events, observed_s=210.0)
    assert [e[0] for e in events] == [100.0, 215.0]
