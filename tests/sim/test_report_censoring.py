"""TTFT percentiles count the requests still waiting for a first token at the end, at their wait
so far (right-censored), instead of only the requests that got one; the report shows the served
fraction next to them and marks lower bounds. The run is a review's reproduction, cut shorter:
the built-in workload at its default sizing for 4 simulated minutes is overloaded, so most
interactive requests are still queued when it ends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetwarden.api.enums import ScalingStrategy, Tier
from fleetwarden.sim.censoring import censored_quantiles
from fleetwarden.sim.cluster import FleetSimulation, SimOptions
from fleetwarden.sim.fleet_spec import load_fleet
from fleetwarden.sim.planning import LastHourPeakPlanner
from fleetwarden.sim.report import ReportInputs, build_summary
from fleetwarden.sim.report_html import CLI_COLUMNS, render_html, table_rows
from fleetwarden.sim.results import SimResults
from fleetwarden.sim.run import RunSpec, run_one
from fleetwarden.sim.workload_builtin import BuiltinWorkload
from tests.sim.test_report_conservation import every_ending, waiting_jobs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
END = 240.0
PERCENTILES = ("p50", "p95", "p99")


@pytest.fixture(scope="module")
def overloaded() -> tuple[FleetSimulation, SimResults]:
    fleet = load_fleet(EXAMPLES)
    workload = BuiltinWorkload(duration_s=END, seed=0).build(fleet)
    options = SimOptions(
        duration_s=END,
        strategy=ScalingStrategy.LT_UA,
        planner=LastHourPeakPlanner(),
        keep_requests=True,
    )
    sim = FleetSimulation(fleet, workload, options)
    return sim, sim.run()


def _ttfts(
    sim: FleetSimulation, results: SimResults, tier: Tier
) -> tuple[list[float], list[float]]:
    """(TTFTs of requests that got a first token, waits so far of those that did not), from the
    kept outcomes and the requests the test finds still waiting."""
    assert results.requests is not None
    served = [
        o.first_token_s - o.arrival_s
        for o in results.requests
        if o.tier == tier.value and o.outcome == "completed" and o.first_token_s is not None
    ]
    censored: list[float] = []
    for job in waiting_jobs(sim):
        if job.tier is not tier:
            continue
        first = job.first_token_s
        if first is not None and not np.isnan(first) and first <= END:
            served.append(first - job.arrival_s)
        else:
            censored.append(END - job.arrival_s)
    return served, censored


def test_censored_quantiles_equal_numpy_without_censoring_and_flag_lower_bounds() -> None:
    observed = np.array([3.0, 1.0, 2.0, 10.0, 4.0])
    plain = censored_quantiles(observed, np.array([]), [0.0, 0.5, 0.95, 1.0])
    assert [q.value for q in plain] == list(np.quantile(observed, [0.0, 0.5, 0.95, 1.0]))
    assert not any(q.lower_bound for q in plain)
    # two requests still waiting after 6 s and 50 s: the median is exact, the tail a lower bound
    mixed = censored_quantiles(observed, np.array([6.0, 50.0]), [0.5, 0.95])
    assert mixed[0].value == 4.0
    assert not mixed[0].lower_bound
    assert mixed[1].value == pytest.approx(np.quantile([1, 2, 3, 4, 6, 10, 50], 0.95))
    assert mixed[1].lower_bound
    with pytest.raises(ValueError, match="within"):
        censored_quantiles(observed, np.array([]), [95.0])
    with pytest.raises(ValueError, match="no values"):
        censored_quantiles(np.array([]), np.array([]), [0.5])


@pytest.mark.parametrize("tier", [Tier.IW_FAST, Tier.IW_NORMAL, Tier.NIW])
def test_ttft_percentiles_count_waiting_requests_at_their_wait_so_far(
    overloaded: tuple[FleetSimulation, SimResults], tier: Tier
) -> None:
    sim, results = overloaded
    served, censored = _ttfts(sim, results, tier)
    stats = results.tiers[tier.value]
    assert len(censored) > len(served) > 0  # overloaded: most are still queued at the end
    assert stats.first_token == len(served)
    assert stats.ttft_covers == "admitted"
    everyone = np.array(served + censored)
    for name in PERCENTILES:
        expected = float(np.percentile(everyone, float(name[1:])))
        assert stats.ttft_s[name] == pytest.approx(expected, rel=1e-12)
        # the figure reported before, still in the results under its own name
        old = float(np.percentile(np.array(served), float(name[1:])))
        assert stats.ttft_served_s[name] == pytest.approx(old, rel=1e-12)
    assert stats.ttft_s != stats.ttft_served_s
    assert stats.ttft_lower_bound == list(PERCENTILES)
    assert stats.ttft_cdf_s[-1] == pytest.approx(float(everyone.max()))


def test_sla_attainment_counts_throttled_rejected_and_waiting_requests_as_misses() -> None:
    """Decided, and pinned: a throttled, rejected, abandoned or still waiting request did not
    get its first token within the target, so it is in attainment's denominator as a miss."""
    options = SimOptions(
        duration_s=120.0,
        strategy=ScalingStrategy.LT_UA,
        planner=LastHourPeakPlanner(),
        keep_requests=True,
    )
    sim = FleetSimulation(load_fleet(EXAMPLES), every_ending(), options)
    results = sim.run()
    stats = results.tiers["iw-f"]
    assert min(stats.throttled, stats.pending, results.totals["abandoned"]) > 0
    target = stats.ttft_target_s
    assert target is not None
    assert results.requests is not None
    ttfts = [
        o.first_token_s - o.arrival_s
        for o in results.requests
        if o.tier == "iw-f" and o.first_token_s is not None
    ]
    ttfts += [
        job.first_token_s - job.arrival_s
        for job in waiting_jobs(sim)
        if job.tier is Tier.IW_FAST and job.first_token_s is not None
    ]  # NaN (no first token yet) is never within the target
    within = sum(1 for ttft in ttfts if ttft <= target)
    arrived = sum(1 for r in every_ending() if r.tier is Tier.IW_FAST)
    assert stats.requests == arrived
    assert stats.attainment == pytest.approx(within / arrived)
    assert stats.attainment_served == pytest.approx(within / stats.first_token)
    rejected = results.tiers["iw-n"]  # the five over-long prompts are all of IW-N
    assert rejected.requests == rejected.rejected == 5
    assert rejected.attainment == 0.0


def _summary(runs: dict[str, Any]) -> dict[str, Any]:
    inputs = ReportInputs(
        fleet=[str(EXAMPLES)],
        workload_kind="builtin",
        workload_parameters={},
        workload_notes=[],
        hours=END / 3600,
        seed=0,
        planner="last-hour-peak",
        scale="test",
    )
    return build_summary(inputs, runs)


def test_the_report_shows_the_served_fraction_and_marks_lower_bounds(
    overloaded: tuple[FleetSimulation, SimResults],
) -> None:
    _, results = overloaded
    summary = _summary({"lt-ua": json.loads(results.to_json())})
    tier = summary["strategies"]["lt-ua"]["tiers"]["iw-f"]
    assert tier["served_fraction"] == pytest.approx(tier["first_token"] / tier["requests"])
    assert tier["ttft_served_s"] != tier["ttft_s"]
    row = dict(zip(CLI_COLUMNS, table_rows(summary, CLI_COLUMNS)[0], strict=True))
    assert row["IW-F p95 TTFT"] == f">={tier['ttft_s']['p95']:.2f} s"
    assert row["IW-F served"] == f"{tier['served_fraction'] * 100:.1f}%"
    page = render_html(summary, [])
    assert "still waiting for one at the end at their wait so far" in page
    assert f"&gt;={tier['ttft_s']['p50']:.2f} s" in page  # the per-tier table marks them too


def test_the_cdf_is_drawn_against_every_arrival() -> None:
    from fleetwarden.sim.report_plots import covered_share  # matplotlib only for this test

    admitted = {
        "requests": 100,
        "first_token": 30,
        "pending": 50,
        "pending_started": 5,
        "ttft_covers": "admitted",
    }
    assert covered_share(admitted) == pytest.approx(0.75)  # 25 throttled, rejected or abandoned
    assert covered_share({"requests": 100, "first_token": 60, "ttft_covers": "served"}) == 0.6
    assert covered_share({"requests": 0, "first_token": 0}) == 1.0


def test_a_fluid_run_keeps_its_served_only_figure_under_both_names() -> None:
    spec = RunSpec((EXAMPLES,), BuiltinWorkload(duration_s=3600.0), 3600.0, fidelity="fluid")
    summary = _summary({"lt-ua": json.loads(run_one(spec, "lt-ua"))})
    tier = summary["strategies"]["lt-ua"]["tiers"]["iw-f"]
    assert tier["ttft_covers"] == "served"
    assert tier["ttft_served_s"] == tier["ttft_s"]
    assert tier["ttft_lower_bound"] is None  # not modelled
    assert 0 < tier["served_fraction"] <= 1
