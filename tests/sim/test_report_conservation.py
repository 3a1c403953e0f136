"""How requests ended: arrived = completed + throttled + rejected + abandoned + pending at the
end, for interactive and NIW requests, in summary.json and report.html, checked on real small
runs, and a report whose counts do not add up says so at its top.

The workload is made by hand so every ending occurs whatever the built-in workload's tuning:
a burst over acme's TPM limit on llama-3-70b in us-east (throttled; far more than two instances
serve in two minutes: pending), follow-ups in the same interactions (those whose first request
was throttled are abandoned), prompts longer than max-model-len (rejected) and NIW items (held
by the release rule under load: pending)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from fleetwarden.api.enums import ScalingStrategy, Tier
from fleetwarden.sim.cluster import FleetSimulation, SimOptions
from fleetwarden.sim.fleet_engine import FleetRunning
from fleetwarden.sim.fleet_spec import Fleet, load_fleet
from fleetwarden.sim.instance import Job
from fleetwarden.sim.planning import LastHourPeakPlanner
from fleetwarden.sim.report import ReportInputs, build_summary
from fleetwarden.sim.report_html import render_html
from fleetwarden.sim.results import SimResults
from fleetwarden.sim.run import RunSpec, run_one
from fleetwarden.sim.workload import SimRequest, Workload, WorkloadInfo
from fleetwarden.sim.workload_builtin import BuiltinWorkload

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
END = 120.0
BURST = 700


def waiting_jobs(sim: FleetSimulation) -> list[Job]:
    """Every request still in the fleet at the end, found where it waits (the test's own walk)."""
    found: list[Job] = []
    for instance in sim.instances.values():
        for running in instance.engine.running:
            assert isinstance(running, FleetRunning)
            found.append(running.tag)
        found += [*instance.inbox, *instance.jobs.values()]
    for unrouted in sim.pending.values():
        found += unrouted
    for queue in sim.niw.values():
        found += queue.jobs()
    return found


def every_ending() -> list[SimRequest]:
    """The hand-made workload (module docstring), in arrival order."""
    out: list[SimRequest] = []

    def add(t: float, tenant: str, prompt: int, tier: Tier, interaction: str | None) -> None:
        out.append(
            SimRequest(t, "llama-3-70b", "us-east", tenant, prompt, 300, tier, None, interaction)
        )

    for i in range(BURST):
        add(i * 0.02, "acme", 8000, Tier.IW_FAST, f"chat-{i}")
    for i in range(5):
        add(15.0 + i, "globex", 20_000, Tier.IW_NORMAL, None)  # over max-model-len 16384
    for i in range(40):
        add(16.0 + i * 0.1, "nightly-evals", 3000, Tier.NIW, None)
    for i in range(BURST):
        add(30.0 + i * 0.02, "acme", 500, Tier.IW_FAST, f"chat-{i}")
    return sorted(out, key=lambda r: r.arrival_s)


class EveryEnding:
    """A `WorkloadSource` for `run_one`."""

    def build(self, fleet: Fleet) -> Workload:
        return Workload(WorkloadInfo("hand-made"), lambda: iter(every_ending()))


def summary_of(runs: dict[str, Any], hours: float = END / 3600) -> dict[str, Any]:
    inputs = ReportInputs(
        fleet=[str(EXAMPLES)],
        workload_kind="hand-made",
        workload_parameters={},
        workload_notes=[],
        hours=hours,
        seed=0,
        planner="last-hour-peak",
        scale="test",
    )
    return build_summary(inputs, runs)


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    spec = RunSpec((EXAMPLES,), EveryEnding(), END)
    return {s: json.loads(run_one(spec, s)) for s in ("reactive", "lt-ua", "static")}


@pytest.fixture(scope="module")
def kept() -> tuple[FleetSimulation, SimResults]:
    options = SimOptions(
        duration_s=END, strategy=ScalingStrategy.LT_UA, planner=LastHourPeakPlanner()
    )
    sim = FleetSimulation(load_fleet(EXAMPLES), every_ending(), options)
    return sim, sim.run()


def test_every_strategys_requests_add_up_and_every_ending_occurs(runs: dict[str, Any]) -> None:
    summary = summary_of(runs)
    arrivals = len(every_ending())
    for name in ("reactive", "lt-ua", "static"):
        books = summary["strategies"][name]["conservation"]
        assert books["balanced"] is True
        iw, niw = books["groups"]["IW"], books["groups"]["NIW"]
        assert iw["arrived"] + niw["arrived"] == arrivals
        for group in (iw, niw):
            endings = ("completed", "throttled", "rejected", "abandoned", "pending")
            assert sum(group[e] for e in endings) == group["arrived"]
            assert group["unaccounted"] == 0
        if name == "lt-ua":  # reactive and static spread the burst over more pods
            assert min(iw["throttled"], iw["rejected"], iw["abandoned"], iw["pending"]) > 0
        assert iw["completed"] > 0
        assert niw["pending"] > 0
        assert niw["abandoned"] == 0
        assert 0 < iw["pending_started"] < iw["pending"]
        figures = summary["strategies"][name]
        assert iw["pending"] + niw["pending"] == figures["pending_at_end"]
        assert iw["abandoned"] == figures["abandoned_requests"]
    page = render_html(summary, [])
    assert "<h2>How requests ended</h2>" in page
    assert page.count("<td>adds up</td>") == 6  # three strategies, IW and NIW
    assert "WARNING" not in page
    assert "DOES NOT ADD UP" not in page


def test_pending_is_counted_where_requests_wait_not_inferred(
    kept: tuple[FleetSimulation, SimResults],
) -> None:
    sim, results = kept
    waiting = waiting_jobs(sim)
    assert results.totals["pending_at_end"] == len(waiting) > 0
    for tier in Tier:
        stats = results.tiers[tier.value]
        assert stats.pending == sum(1 for job in waiting if job.tier is tier)
        ended = stats.completed + stats.throttled + stats.rejected + stats.pending
        abandoned = results.totals["abandoned"] if tier is Tier.IW_FAST else 0  # acme's only
        arrived = sum(1 for r in every_ending() if r.tier is tier)
        assert stats.requests == arrived == ended + abandoned
    assert results.niw.pending == results.tiers["niw"].pending


def test_a_report_whose_counts_do_not_add_up_says_so_at_its_top(runs: dict[str, Any]) -> None:
    broken = copy.deepcopy(runs)
    broken["lt-ua"]["tiers"]["iw-f"]["pending"] -= 1  # one request lost from the books
    summary = summary_of(broken)
    books = summary["strategies"]["lt-ua"]["conservation"]
    assert books["balanced"] is False
    assert books["groups"]["IW"]["unaccounted"] == 1
    assert summary["strategies"]["reactive"]["conservation"]["balanced"] is True
    page = render_html(summary, [])
    top = page[: page.index("<h2>")]
    alarm = top[top.index("<p class='alarm'") :].split("</p>")[0]
    assert "WARNING: Request counts do not add up" in alarm
    assert "lt-ua (IW: +1)" in alarm
    assert "reactive" not in alarm
    assert "DOES NOT ADD UP: +1 unaccounted" in page


def test_a_fluid_run_is_not_checked_and_says_so() -> None:
    spec = RunSpec((EXAMPLES,), BuiltinWorkload(duration_s=3600.0), 3600.0, fidelity="fluid")
    summary = summary_of({"lt-ua": json.loads(run_one(spec, "lt-ua"))}, hours=1.0)
    books = summary["strategies"]["lt-ua"]["conservation"]
    assert books["balanced"] is None
    assert books["groups"]["IW"]["throttled"] is None
    assert books["groups"]["IW"]["arrived"] > 0
    page = render_html(summary, [])
    assert "<td>not checked</td>" in page
    assert "WARNING" not in page
