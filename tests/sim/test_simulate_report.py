"""The pieces of the simulate report that need no simulation: the closed-form fluidity-index,
sizing by instances, the comparison against reactive and the strategy runner's checks."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from fleetwarden.fairness.fluidity import fluidity_index
from fleetwarden.sim.fleet_spec import load_fleet
from fleetwarden.sim.report import comparison
from fleetwarden.sim.results import even_fluidity
from fleetwarden.sim.run import RunError, check_strategies, instance_sizing, make_planner

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_even_fluidity_is_algorithm_1_on_evenly_spaced_tokens() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        ttft_d, tbt_d = rng.choice([0.5, 1.0, 10.0]), rng.choice([0.02, 0.05, 0.1])
        ttft = rng.uniform(0, 3 * ttft_d)
        gap = rng.uniform(0, 3 * tbt_d)
        tokens = rng.randint(1, 60)
        expected = fluidity_index(ttft_d, tbt_d, [ttft] + [gap] * (tokens - 1))
        assert even_fluidity(ttft, gap, tokens, ttft_d, tbt_d) == pytest.approx(expected, abs=1e-3)


def test_sizing_by_instances_uses_each_regions_throughput() -> None:
    fleet = load_fleet(EXAMPLES)
    sizing = instance_sizing(fleet, {"llama-3-70b": 2.0, "*": 0.5})
    assert sizing["llama-3-70b"] == {"us-east": 4400.0, "us-west": 4400.0, "eu-west": 8200.0}
    assert sizing["mistral-7b"] == {"us-east": 2600.0, "eu-west": 4900.0}
    with pytest.raises(RunError, match="lacks"):
        instance_sizing(fleet, {"gpt-9": 1.0})


def _figures(gpu_hours: float, cold: float, attainment: float) -> dict[str, Any]:
    tier = {"attainment": attainment, "ttft_s": {"p95": 1.0}}
    return {
        "gpu_hours": gpu_hours,
        "cold_start_gpu_hours": cold,
        "niw": {"met_deadline": 9, "items": 10, "late": 1, "pending_overdue": 0},
        "tiers": {"iw-f": tier, "iw-n": tier},
    }


def test_comparison_is_against_reactive() -> None:
    table = comparison({"reactive": _figures(100.0, 4.0, 0.9), "lt-ua": _figures(70.0, 1.0, 0.95)})
    assert table["baseline"] == "reactive"
    assert table["lt-ua"]["gpu_hours_saving_vs_baseline"] == pytest.approx(0.3)
    assert table["lt-ua"]["cold_start_vs_baseline"] == pytest.approx(0.25)
    assert table["lt-ua"]["attainment_at_least_baseline"] == {"iw-f": True, "iw-n": True}
    assert table["lt-ua"]["niw_met_fraction"] == pytest.approx(0.9)
    assert table["lt-ua"]["niw_missed_deadline"] == 1
    alone = comparison({"lt-ua": _figures(70.0, 1.0, 0.95)})
    assert alone["baseline"] is None
    assert "gpu_hours_saving_vs_baseline" not in alone["lt-ua"]


def test_strategies_and_planners_are_checked() -> None:
    assert check_strategies(["lt-ua", "reactive", "lt-ua"]) == ("lt-ua", "reactive")
    with pytest.raises(RunError, match="unknown strategies"):
        check_strategies(["fast"])
    with pytest.raises(RunError, match="unknown planner"):
        make_planner("crystal-ball")
