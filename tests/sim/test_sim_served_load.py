"""The tokens/s series the simulated planner and LT-UA read is what the operator reads: tokens
served, under the serving endpoint, counted at completion (the sidecar's `fleetwarden_tokens_total`
with tier!="niw"), and NIW tokens of completed items (the batch service's counter).

Before: every request's tokens were added when it arrived, before throttling, length rejection
or spilling, under its home region; in the review's case the first hour's series held 12,976,200
tokens where 4,321,200 were served, and the plan at 1 h targeted 2 instances instead of 1
(review item 4)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np

from fleetwarden.api.enums import ScalingStrategy, Tier
from fleetwarden.sim.cluster import FleetSimulation, SimOptions
from fleetwarden.sim.fleet_spec import Fleet, load_fleet
from fleetwarden.sim.fluid import FluidSimulation
from fleetwarden.sim.fluid_rates import rate_model_for
from fleetwarden.sim.planning import EndpointKey, LastHourPeakPlanner
from fleetwarden.sim.workload import SimRequest
from fleetwarden.sim.workload_builtin import BuiltinWorkload

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LLAMA = "llm-serving/llama-3-70b"
EAST, WEST = (LLAMA, "us-east-a100"), (LLAMA, "us-west-a100")
SIZE = 600  # prompt + output tokens of every request below


@cache
def _fleet() -> Fleet:
    return load_fleet(EXAMPLES)


def _requests(
    rate: float, span_s: float, region: str, tier: Tier, seed: int = 1
) -> list[SimRequest]:
    rng = np.random.default_rng(seed)
    times = np.sort(rng.uniform(0, span_s, int(span_s * rate)))
    return [SimRequest(float(t), "llama-3-70b", region, "someone", 500, 100, tier) for t in times]


def _recorded(sim: FleetSimulation, key: EndpointKey, end: float, *, niw: bool = False) -> float:
    history = sim.load.history(key, end, 60.0, 1)
    return sum((history.niw_tps if niw else history.iw_tps).values) * 60.0


def test_throttled_requests_add_nothing_and_the_plan_sizes_for_what_was_served() -> None:
    span = 3600.0 + 120
    requests = _requests(6.0, span, "us-west", Tier.IW_NORMAL)  # rpm 120 per pod: most are 429
    options = SimOptions(
        duration_s=span,
        strategy=ScalingStrategy.LT_I,
        planner=LastHourPeakPlanner(),
        keep_requests=True,
    )
    sim = FleetSimulation(_fleet(), requests, options)
    results = sim.run()
    done = [r for r in results.requests if r.outcome == "completed"]
    assert results.totals["throttled"] > results.totals["completed"] > 0
    for key in sim.endpoints:  # a few spill to the other regions' endpoints
        here = [r for r in done if (r.model, r.pool) == key]
        assert _recorded(sim, key, span) == SIZE * len(here)
        early = sum(1 for r in here if r.completion_s is not None and r.completion_s < 3600)
        assert _recorded(sim, key, 3600.0) == SIZE * early
    plan = sim.plans[f"{WEST[0]}/{WEST[1]}"][1]
    assert plan[0] == 3600.0
    assert plan[1] == 1  # ceil(~1,200 served tokens/s / 2,200 per instance); arrivals asked 2


def test_a_spilled_request_counts_where_it_was_served() -> None:
    """us-west has no instance: its requests are served in the other regions, and the series
    of the endpoints that served them hold their tokens; us-west's stays empty."""
    fleet = _fleet()
    requests = _requests(0.5, 1800.0, "us-west", Tier.IW_NORMAL)
    options = SimOptions(
        duration_s=1800.0, scaling=False, initial_instances={WEST: 0}, keep_requests=True
    )
    sim = FleetSimulation(fleet, requests, options)
    results = sim.run()
    done = [r for r in results.requests if r.outcome == "completed"]
    assert done
    assert all(r.pool != WEST[1] for r in done)
    assert _recorded(sim, WEST, 1800.0) == 0.0
    for key in sim.endpoints:
        if key[0] == LLAMA:
            served = SIZE * sum(1 for r in done if r.pool == key[1])
            assert _recorded(sim, key, 1800.0) == served


def test_niw_items_count_as_niw_when_they_complete_and_never_as_interactive() -> None:
    """...and a request longer than the KV budget, of either kind, is rejected: nothing."""
    too_long = [
        SimRequest(900.0, "llama-3-70b", "us-east", "someone", 70_000, 100, tier)
        for tier in (Tier.NIW, Tier.IW_FAST)
    ]
    requests = sorted(
        _requests(0.05, 1800.0, "us-east", Tier.NIW)
        + _requests(0.05, 1800.0, "us-east", Tier.IW_FAST, seed=2)
        + too_long,
        key=lambda r: r.arrival_s,
    )
    options = SimOptions(duration_s=1800.0, strategy=ScalingStrategy.LT_I, keep_requests=True)
    sim = FleetSimulation(_fleet(), requests, options)
    results = sim.run()
    assert results.niw.promoted == 0
    assert results.totals["rejected"] == 2
    done = [r for r in results.requests if r.outcome == "completed"]
    niw = [r for r in done if r.tier == "niw"]
    assert niw
    assert len(niw) < len(done)
    for key in (EAST, (LLAMA, "eu-west-h100")):
        here = [r for r in done if r.pool == key[1]]
        assert _recorded(sim, key, 1800.0, niw=True) == SIZE * sum(r.tier == "niw" for r in here)
        assert _recorded(sim, key, 1800.0) == SIZE * sum(r.tier != "niw" for r in here)


def test_the_fluid_series_holds_served_tokens_not_arrivals() -> None:
    """Pinned at minInstances under the built-in workload's full default load, each endpoint
    serves at most its instances' capacity a minute: the series never exceeds it (arrivals do,
    several times over)."""
    fleet = _fleet()
    rates = rate_model_for(BuiltinWorkload(duration_s=7200.0, start_hour=12), fleet, 60.0)
    options = SimOptions(duration_s=7200.0, scaling=False)
    sim = FluidSimulation(fleet, rates, options)
    sim.run()
    for key, lane in sim.lanes.items():
        placement = lane.endpoint.placement
        capacity = placement.min_instances * lane.service.throughput_tps
        history = sim.load.history(key, 7200.0, 60.0, 1)
        assert max(history.iw_tps.values) <= capacity * (1 + 1e-9)
        served = sum(history.iw_tps.values) + sum(history.niw_tps.values)
        assert served > 0
    arrived = sum(r.iw for r in rates.rates(3600.0, 3660.0).values())
    assert arrived > 2 * sum(
        lane.endpoint.placement.min_instances * lane.service.throughput_tps
        for lane in sim.lanes.values()
    )


def test_promoted_niw_items_count_in_both_series() -> None:
    """An item promoted to iw-n near its deadline passes the sidecar as iw-n (interactive
    series) and is still a completed batch item (NIW series)."""
    items = [
        SimRequest(i / 100, "llama-3-70b", "us-east", "someone", 500, 100, Tier.NIW, deadline_s=1.0)
        for i in range(20)  # one in flight at a time: the others wait past 0.4 s, promoted
    ]
    options = SimOptions(duration_s=900.0, strategy=ScalingStrategy.LT_I, niw_max_in_flight=1)
    sim = FleetSimulation(_fleet(), items, options)
    results = sim.run()
    assert results.niw.promoted > 0
    assert results.niw.completed == len(items)
    iw = sum(_recorded(sim, key, 900.0) for key in sim.endpoints)
    niw = sum(_recorded(sim, key, 900.0, niw=True) for key in sim.endpoints)
    assert niw == SIZE * len(items)
    assert iw == SIZE * results.niw.promoted
