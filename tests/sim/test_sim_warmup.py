"""The planner's warm-up: a run's planner starts with days of the workload's own past, as the
operator starts with days of Prometheus history, and each round records which forecast model ran.

Before: the first round of every run had no history (every endpoint "no-data", held) and, ARIMA
needing 2 days, every round of a 24-hour run was the last-peak fallback, while the report said
"forecast" (review item 1)."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleetwarden.api.enums import ScalingStrategy
from fleetwarden.cli import main
from fleetwarden.forecasting.series import DAY_S
from fleetwarden.sim.cluster import FleetSimulation, SimOptions
from fleetwarden.sim.fleet_spec import Fleet, load_fleet
from fleetwarden.sim.fluid import FluidSimulation
from fleetwarden.sim.fluid_rates import BuiltinRates, rate_model_for
from fleetwarden.sim.forecast_planner import ForecastPlanner
from fleetwarden.sim.plan_inputs import (
    PriorLoad,
    forecast_model_counts,
    round_models,
    warm_history,
    workload_prior,
)
from fleetwarden.sim.planning import LastHourPeakPlanner, LoadRecorder, PlanEntry
from fleetwarden.sim.servegen_workload import ServeGenWorkload, available
from fleetwarden.sim.trace_workload import TraceWorkload
from fleetwarden.sim.warmup import (
    BuiltinWithPast,
    builtin_prior,
    default_warmup_days,
    servegen_prior,
    with_warmup,
)
from fleetwarden.sim.workload import WorkloadError
from fleetwarden.sim.workload_builtin import BuiltinWorkload

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LLAMA_EAST = ("llm-serving/llama-3-70b", "us-east-a100")


@cache
def _fleet() -> Fleet:
    return load_fleet(EXAMPLES)


def _plain(duration_s: float = 600.0, seed: int = 0) -> BuiltinWorkload:
    return BuiltinWorkload(duration_s=duration_s, seed=seed, rate_scale=0.02)


def test_the_first_round_of_a_run_forecasts_with_arima_from_the_past() -> None:
    fleet = _fleet()
    spec = with_warmup(_plain(), None, fleet)
    assert isinstance(spec, BuiltinWithPast)
    assert spec.warmup_days == 7.0
    planner = ForecastPlanner()
    options = SimOptions(duration_s=600.0, strategy=ScalingStrategy.LT_UA, planner=planner)
    results = FleetSimulation(fleet, spec.build(fleet), options).run()
    assert planner.last is not None
    assert planner.last.now_s == 0.0
    assert {e.forecast_model for e in planner.last.endpoints.values()} == {"arima"}
    assert not any(e.held for e in planner.last.endpoints.values())
    assert results.series["planColumns"] == ["time_s", "target", "forecast_tps", "forecast_model"]
    for rows in results.series["plans"].values():
        assert rows[0][3] == "arima"
        assert rows[0][2] > 0


def test_without_a_past_the_first_round_holds_and_says_no_data() -> None:
    fleet = _fleet()
    options = SimOptions(duration_s=600.0, strategy=ScalingStrategy.LT_I, planner=ForecastPlanner())
    for spec in (_plain(), with_warmup(_plain(), 0, fleet)):
        results = FleetSimulation(fleet, spec.build(fleet), options).run()
        assert {rows[0][3] for rows in results.series["plans"].values()} == {"no-data"}


def test_the_past_enters_no_figure() -> None:
    """Only the planner reads it: the run's requests, its observed load (LT-UA, the samples)
    and its recorded series are the run's own."""
    fleet = _fleet()
    spec = with_warmup(_plain(), 2, fleet)
    workload = spec.build(fleet)
    options = SimOptions(duration_s=600.0, strategy=ScalingStrategy.LT_UA)
    sim = FleetSimulation(fleet, workload, options)
    results = sim.run()
    assert results.totals["requests"] == len(list(_plain().build(fleet)))
    first = results.series["samples"]["/".join(LLAMA_EAST)][0]
    assert first[0] == 0.0
    assert first[7] is None
    assert sim.load.observed_tps(LLAMA_EAST, 60.0, 3600.0) == sim.load.observed_tps(
        LLAMA_EAST, 60.0, 60.0
    )  # nothing recorded before time 0
    assert workload_prior(workload, 60.0) is not None  # while the planner had 2 days


def test_the_planners_history_runs_back_into_the_past_on_the_same_grid() -> None:
    buckets = 3 * 1440
    prior = PriorLoad(
        60.0,
        buckets,
        {LLAMA_EAST: tuple(float(i) for i in range(buckets))},
        {LLAMA_EAST: (5.0,) * buckets},
    )
    load = LoadRecorder(60.0)
    load.add(LLAMA_EAST, 30.0, 600.0, niw=False)  # 10 tokens/s in the run's first minute
    history = warm_history(load, prior, LLAMA_EAST, 3600.0, 300.0, 2)
    iw = history.iw_tps
    assert (iw.start_s, iw.step_s, len(iw.values)) == (3600.0 - 2 * DAY_S, 300.0, 2 * 288)
    assert iw.values[-13] == sum(range(buckets - 5, buckets)) / 5  # the last 5 minutes before 0
    assert iw.values[-12:] == load.history(LLAMA_EAST, 3600.0, 300.0, 2).iw_tps.values
    assert iw.values[-12] == 2.0  # 600 tokens over the first 5 minutes
    assert history.niw_tps.values[:-12] == (5.0,) * (2 * 288 - 12)
    # a window within the run has no part before 0; a window longer than the past stops at it
    assert warm_history(load, prior, LLAMA_EAST, 2 * DAY_S, 300.0, 1) == load.history(
        LLAMA_EAST, 2 * DAY_S, 300.0, 1
    )
    assert warm_history(load, prior, LLAMA_EAST, 0.0, 300.0, 7).iw_tps.start_s == -3 * DAY_S
    with pytest.raises(ValueError, match="buckets"):
        warm_history(LoadRecorder(30.0), prior, LLAMA_EAST, 0.0, 300.0, 1)


def test_the_builtin_past_follows_the_workloads_own_cycle() -> None:
    fleet = _fleet()
    spec = _plain(seed=3)
    prior = builtin_prior(spec, fleet, 7, 60.0)
    assert prior is not None
    assert prior.buckets == 7 * 1440
    assert prior.days == 7.0
    assert prior == builtin_prior(spec, fleet, 7, 60.0)  # seeded
    assert prior != builtin_prior(_plain(seed=4), fleet, 7, 60.0)
    series = prior.iw[LLAMA_EAST]
    days = [sum(series[d * 1440 : (d + 1) * 1440]) / 1440 for d in range(7)]
    # time 0 is a Monday: the two days before it are the weekend (RAGPulse's 0.70)
    assert days[5] / days[4] == pytest.approx(0.70, rel=0.03)
    assert days[6] / days[0] == pytest.approx(0.70, rel=0.03)
    rates = BuiltinRates(spec, fleet)
    expected = [
        rates.rates(t, t + 60.0)["llama-3-70b", "us-east"].iw for t in range(-7 * 86400, 0, 60)
    ]
    assert sum(series) == pytest.approx(sum(expected), rel=0.01)  # drawn around the rates
    assert series != tuple(expected)  # with the noise a real series has


def test_a_fluid_run_plans_its_first_hour_from_the_same_past() -> None:
    fleet = _fleet()
    planned = []
    for days in (None, 0.0):
        spec = with_warmup(_plain(3600.0), days, fleet)
        rates = rate_model_for(spec, fleet, 60.0)
        options = SimOptions(
            duration_s=3600.0, strategy=ScalingStrategy.LT_I, planner=LastHourPeakPlanner()
        )
        sim = FluidSimulation(fleet, rates, options)
        results = sim.run()
        planned.append(results.series["plans"]["/".join(LLAMA_EAST)][0])
    warm, cold = planned
    assert warm[3] == "last-hour-peak"
    assert warm[2] > 0
    assert cold[3] == "no-data"
    assert cold[2] is None


def test_no_past_for_a_trace_nor_with_zero_days_and_the_notes_say_so(tmp_path: Path) -> None:
    fleet = _fleet()
    path = tmp_path / "trace.parquet"
    table = pa.table({"arrival_s": [0.0, 1.0], "input_tokens": [10, 10], "output_tokens": [5, 5]})
    pq.write_table(table, path)
    trace = with_warmup(TraceWorkload(path=path, model="llama-3-70b"), None, fleet)
    workload = trace.build(fleet)
    assert workload_prior(workload, 60.0) is None
    assert workload.info.parameters["warmupDays"] == 0.0
    assert any(n.startswith("No planner warm-up: a trace") for n in workload.info.notes)
    off = with_warmup(_plain(), 0, fleet).build(fleet)
    assert workload_prior(off, 60.0) is None
    assert any(n.startswith("Planner warm-up off") for n in off.info.notes)
    on = with_warmup(_plain(), 1.5, fleet).build(fleet)
    assert on.info.parameters["warmupDays"] == 1.5
    assert any(n.startswith("Planner warm-up: ") for n in on.info.notes)
    assert list(on) == list(_plain().build(fleet))  # the same requests


@pytest.mark.parametrize("days", [-1.0, math.nan, math.inf, 61.0])
def test_a_bad_number_of_days_is_a_workload_error(days: float) -> None:
    with pytest.raises(WorkloadError, match="--warmup-days"):
        with_warmup(_plain(), days, _fleet())


def test_the_default_is_the_longest_history_days_capped_at_a_week() -> None:
    assert default_warmup_days(_fleet()) == 7.0


@pytest.mark.skipif(not available(), reason="ServeGen data not present")
def test_servegen_past_is_the_released_rates_before_the_start() -> None:
    fleet = _fleet()
    spec = ServeGenWorkload(duration_s=3600.0, start_s=2 * DAY_S, fraction=0.001)
    prior = servegen_prior(spec, fleet, 1, 60.0)
    assert prior is not None
    assert prior.buckets == 1440
    total = sum(sum(series) for series in prior.iw.values())
    earlier = ServeGenWorkload(duration_s=DAY_S, start_s=DAY_S, fraction=0.001)
    rates = rate_model_for(earlier, fleet, 60.0)
    expected = sum(
        sum(r.iw for r in rates.rates(t, t + 60.0).values()) for t in range(0, 86400, 60)
    )
    assert total == pytest.approx(expected, rel=0.02)


def test_round_models_and_their_counts() -> None:
    fleet = _fleet()
    key = LLAMA_EAST
    plans = {key: PlanEntry(2, 100.0), ("m", "p"): PlanEntry(1, None)}
    lhp = round_models(LastHourPeakPlanner(), 0.0, plans)
    assert lhp == {key: "last-hour-peak", ("m", "p"): "no-data"}

    class Silent:
        def plan(self, now_s, fleet, history, current):  # type: ignore[no-untyped-def]
            return {}

    assert round_models(Silent(), 0.0, plans) == {key: None, ("m", "p"): None}
    planner = ForecastPlanner()
    history = {key: warm_history(LoadRecorder(), None, key, 0.0, 300.0, 7)}
    planner.plan(0.0, fleet, history, {key: 2})
    assert round_models(planner, 0.0, {key: PlanEntry(2, None)}) == {key: "no-data"}
    assert round_models(planner, 3600.0, {key: PlanEntry(2, None)}) == {key: None}  # stale
    rows = {"a": [[0, 1, 2.0, "arima"], [1, 1, 2.0, "arima"]], "b": [[0, 1, None, "no-data"]]}
    rows["c"] = [[0, 1, 2.0], [1, 1, 2.0, None]]  # rows without a model are left out
    assert forecast_model_counts(rows) == {"arima": 2, "no-data": 1}


def test_the_cli_warms_up_by_default_records_the_models_and_reports_them(tmp_path: Path) -> None:
    common = [
        "simulate",
        "--fleet",
        str(EXAMPLES),
        "--hours",
        "0.25",
        "--rate-scale",
        "0.02",
        "--strategies",
        "lt-ua",
        "--quiet",
    ]
    for extra, models, days in (
        ([], {"arima": 5}, 7.0),
        (["--warmup-days", "0"], {"no-data": 5}, 0.0),
    ):
        out = tmp_path / f"out{days:g}"
        assert main([*common, "--out", str(out), *extra]) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["workload"]["parameters"]["warmupDays"] == days
        assert summary["strategies"]["lt-ua"]["forecast_models"] == models
        run = json.loads((out / "runs" / "lt-ua.json").read_text())
        assert run["series"]["planColumns"][3] == "forecast_model"
        page = (out / "report.html").read_text()
        assert "<b>Forecast models</b>" in page
        assert f"lt-ua: {next(iter(models))} 5" in page


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_the_cli_refuses_a_bad_warmup_in_one_line(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "--fleet", str(EXAMPLES), "--hours", "0.25", "--rate-scale", "0.02"]
    args += ["--strategies", "lt-ua", "--planner", "last-hour-peak", "--quiet"]
    assert main([*args, "--out", str(tmp_path), "--warmup-days", value]) == 2
    err = capsys.readouterr().err
    assert "--warmup-days" in err
    assert err.count("\n") == 1
