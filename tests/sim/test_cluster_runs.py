"""Whole runs on the example fleet: deterministic JSON, every strategy runs, books balance."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from fleetwarden.api.enums import ScalingStrategy
from fleetwarden.sim.cluster import SimOptions, simulate
from fleetwarden.sim.fleet_spec import Fleet, load_fleet
from fleetwarden.sim.planning import LastHourPeakPlanner, LoadHistory, PlanEntry
from fleetwarden.sim.results import SimResults
from fleetwarden.sim.workload import SimRequest
from fleetwarden.sim.workload_builtin import BuiltinWorkload

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HOURS = 2


@cache
def _fleet() -> Fleet:
    return load_fleet(EXAMPLES)


@cache
def _workload(seed: int) -> tuple[SimRequest, ...]:
    spec = BuiltinWorkload(duration_s=HOURS * 3600, seed=seed, rate_scale=0.02, start_hour=7)
    return tuple(spec.build(_fleet()))


def _run(strategy: ScalingStrategy, seed: int = 0) -> SimResults:
    options = SimOptions(duration_s=HOURS * 3600, strategy=strategy, seed=seed)
    return simulate(_fleet(), _workload(seed), options)


def test_the_same_seed_gives_the_same_json() -> None:
    first, again = _run(ScalingStrategy.LT_UA), _run(ScalingStrategy.LT_UA)
    assert first.to_json() == again.to_json()
    assert first.to_json() != _run(ScalingStrategy.LT_UA, seed=1).to_json()
    parsed = json.loads(first.to_json())
    assert parsed["meta"]["fidelity"] == "request-level"
    assert set(parsed["tiers"]) == {"iw-f", "iw-n", "niw"}


@pytest.mark.parametrize("strategy", list(ScalingStrategy))
def test_every_strategy_runs_a_small_day_and_keeps_its_books(strategy: ScalingStrategy) -> None:
    # speed is measured by bench/simulator.py, never asserted here
    results = _run(strategy)
    requests = results.totals["requests"]
    assert requests == len(_workload(0))
    totals = results.totals
    accounted = totals["completed"] + totals["throttled"] + totals["rejected"]
    assert accounted + totals["pending_at_end"] + totals["abandoned"] == requests
    assert totals["completed"] > 0.95 * requests
    # the books: GPU-hours are instance-hours times GPUs, cost is GPU-hours times the price
    for stats in results.endpoints.values():
        assert stats.gpu_hours >= stats.instance_hours
        assert stats.cold_start_gpu_hours <= stats.gpu_hours
    assert totals["gpu_hours"] == pytest.approx(
        sum(s.gpu_hours for s in results.endpoints.values())
    )
    assert results.niw.completed == results.niw.met_deadline
    samples = results.series["samples"]["llm-serving/llama-3-70b/us-east-a100"]
    assert len(samples) == HOURS * 60 + 1  # every minute, both ends included
    assert all(row[1] + row[2] >= 2 for row in samples)  # never below minInstances


def test_the_planner_is_called_every_hour_with_the_history() -> None:
    seen: list[tuple[float, dict[tuple[str, str], LoadHistory]]] = []

    class Recording(LastHourPeakPlanner):
        def plan(self, now_s, fleet, history, current):  # type: ignore[no-untyped-def]
            seen.append((now_s, dict(history)))
            return super().plan(now_s, fleet, history, current)

    results = simulate(
        _fleet(),
        _workload(0),
        SimOptions(duration_s=HOURS * 3600, strategy=ScalingStrategy.LT_I, planner=Recording()),
    )
    assert [t for t, _ in seen] == [0.0, 3600.0]
    key = ("llm-serving/llama-3-70b", "us-east-a100")
    last = seen[-1][1][key]
    assert last.iw_tps.step_s == 300.0
    assert len(last.iw_tps.values) == 12  # an hour of 5-minute steps
    assert sum(last.iw_tps.values) > 0
    plans = results.series["plans"]["llm-serving/llama-3-70b/us-east-a100"]
    assert [row[0] for row in plans] == [0.0, 3600.0]


def test_a_plan_sets_the_target_lt_i_walks_to() -> None:
    class Fixed:
        def plan(self, now_s, fleet, history, current):  # type: ignore[no-untyped-def]
            return {key: PlanEntry(4, 1000.0) for key in history}

    results = simulate(
        _fleet(),
        _workload(0)[:200],
        SimOptions(duration_s=1800.0, strategy=ScalingStrategy.LT_I, planner=Fixed()),
    )
    samples = results.series["samples"]["llm-serving/llama-3-70b/us-east-a100"]
    ready, loading = samples[-1][1], samples[-1][2]
    assert ready + loading == 4
    assert results.totals["launches"] > 0


def test_a_declared_throughput_below_saturation_gives_faster_engines() -> None:
    """theta_load 0.7: the declared tokens/s is 70% of what saturates an instance, so the same
    workload on the same plan sees every engine 1/0.7 times faster: shorter first tokens."""
    strategy = ScalingStrategy.LT_UA
    options = SimOptions(duration_s=HOURS * 3600, strategy=strategy, theta_load=0.7)
    relaxed = json.loads(simulate(_fleet(), _workload(0), options).to_json())
    literal = json.loads(_run(strategy).to_json())
    assert (relaxed["meta"]["thetaLoad"], literal["meta"]["thetaLoad"]) == (0.7, 1.0)
    for tier in ("iw-f", "iw-n"):
        assert (
            relaxed["tiers"][tier]["ttft_s"]["p50"] < 0.8 * literal["tiers"][tier]["ttft_s"]["p50"]
        )
