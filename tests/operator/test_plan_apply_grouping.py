"""Applying a round groups its endpoints and forecasts by ModelDeployment once.

`FleetPlanner._apply` used to look every ModelDeployment up in all endpoints
(`result.endpoints`) and all forecasts (`RoundResult.held_regions`): 8 ms at 200
ModelDeployments x 5 regions, 716 ms at 2,000 x 5. The old `_apply` is kept below as the
reference: on generated fleets the grouped one must leave exactly the same plans, records and
health, and it must read each endpoint and forecast a constant number of times.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import pytest

from fleetwarden.forecasting.forecast import Forecast, ForecastModel
from fleetwarden.forecasting.hourly import EndpointPlan, RegionForecast, RoundResult
from fleetwarden.operator.autoscaler import Autoscaler, RegionPlan
from fleetwarden.operator.hourly_planner import FleetPlanner
from fleetwarden.operator.plan_status import (
    NO_HISTORY,
    PLAN_APPLIED,
    EndpointRecord,
    PlanBook,
    PlanHealth,
)

K = TypeVar("K")
V = TypeVar("V")


def reference_apply(
    planner: FleetPlanner, result: RoundResult, plan_time_s: float, period_s: float
) -> None:
    """`FleetPlanner._apply` before grouping (per ModelDeployment scans), verbatim."""
    planner.last = result
    by_model: dict[str, list[str]] = {}
    for key, e in sorted(result.endpoints.items()):
        if e.held:
            planner.autoscaler.plans.pop(key, None)
        else:
            planner.autoscaler.plans[key] = RegionPlan(e.target, e.region_peak_tps, period_s)
        planner.book.endpoints[key] = EndpointRecord(
            region=e.region,
            current=e.current,
            target=e.target,
            peak_tps=e.region_peak_tps,
            forecast_model=e.forecast_model,
            healthy=e.healthy,
            fallback_reason=e.fallback_reason,
            held=e.held,
            forecast_time_s=result.now_s,
            plan_time_s=plan_time_s,
        )
        by_model.setdefault(e.model_deployment, []).append(f"{e.pool}={e.target}")
    solver = f"solver {result.status}" + (
        "" if result.gap is None else f", gap {100 * result.gap:.2f}%"
    )
    for md, targets in by_model.items():
        held = sorted(
            f.region
            for f in result.forecasts.values()
            if f.model_deployment == md and f.peak_tps is None
        )
        regions = {e.region for e in result.endpoints.values() if e.model_deployment == md}
        if held and len(held) == len(regions):
            message = f"no tokens/s history in Prometheus for {', '.join(held)}; replicas hold"
            planner.book.health[md] = PlanHealth(False, NO_HISTORY, message)
            continue
        message = f"targets {', '.join(targets)} ({solver})"
        if held:
            message += f"; no history for {', '.join(held)}: those hold their replicas"
        planner.book.health[md] = PlanHealth(True, PLAN_APPLIED, message)


def _forecast(peak: float) -> Forecast:
    return Forecast(0.0, 60.0, (peak,), (peak,), (peak,), peak, ForecastModel.LAST_PEAK)


def generated_round(rng: random.Random, n_mds: int, gap: float | None = 0.01) -> RoundResult:
    """ModelDeployments of 1-4 regions with 1-2 pools each; a region has no history (held) at
    random, sometimes all of a model's (always md 0's; md 1 has one held of two or more, md 2
    none); the dicts are filled in a shuffled order."""
    endpoints: list[tuple[tuple[str, str], EndpointPlan]] = []
    forecasts: list[tuple[tuple[str, str], RegionForecast]] = []
    for i in range(n_mds):
        md = f"ns-{i % 3}/md-{i:05d}"
        all_held = i == 0 or (i > 2 and rng.random() < 0.15)
        n_regions = rng.randint(2 if i == 1 else 1, 4)
        for r, region in enumerate(rng.sample([f"region-{j}" for j in range(6)], n_regions)):
            held = all_held or (r == 0 if i == 1 else i > 2 and rng.random() < 0.25)
            peak = None if held else rng.uniform(1.0, 1000.0)
            forecasts.append(
                ((md, region), RegionForecast(md, region, _forecast(peak or 0.0), 0.0, peak))
            )
            for k in range(rng.randint(1, 2)):
                pool = f"{region}-pool-{k}"
                current = rng.randint(0, 5)
                target = current if held else rng.randint(0, 8)
                model = "no-data" if held else "arima"
                plan = EndpointPlan(
                    md, pool, region, current, target, peak, peak, model, not held, None, held, 1.0
                )
                endpoints.append(((md, pool), plan))
    rng.shuffle(endpoints)
    rng.shuffle(forecasts)
    return RoundResult(
        1_800_000_000.0, dict(endpoints), dict(forecasts), None, "optimal", gap, 0.0, ()
    )


def planner() -> FleetPlanner:
    return FleetPlanner(
        None,  # type: ignore[arg-type]  # _apply never queries Prometheus
        Autoscaler(),
        PlanBook(),
        lambda: None,  # type: ignore[arg-type,return-value]
        lambda key: None,
    )


def with_previous_plans(p: FleetPlanner, result: RoundResult) -> FleetPlanner:
    """Plans left from an earlier round for some endpoints (a held one must lose its plan)."""
    for key in list(result.endpoints)[::3]:
        p.autoscaler.plans[key] = RegionPlan(7, 1.0, 3600.0)
    return p


@pytest.mark.parametrize("seed", range(8))
def test_grouped_apply_leaves_what_the_per_model_scans_left(seed: int) -> None:
    rng = random.Random(seed)
    result = generated_round(rng, rng.randint(3, 60), gap=None if seed % 2 else 0.0123)
    grouped, scanned = (
        with_previous_plans(planner(), result),
        with_previous_plans(planner(), result),
    )
    try:
        grouped._apply(result, 1_800_000_100.0, 1800.0)
        reference_apply(scanned, result, 1_800_000_100.0, 1800.0)
        assert grouped.last is scanned.last is result
        assert grouped.autoscaler.plans == scanned.autoscaler.plans
        assert grouped.book.endpoints == scanned.book.endpoints
        assert list(grouped.book.health.items()) == list(scanned.book.health.items())
        messages = [h.message for h in grouped.book.health.values()]
        assert any(m.startswith("no tokens/s history") for m in messages)  # all held
        assert any("those hold their replicas" in m for m in messages)  # some held
        assert any(m.startswith("targets") and "no history" not in m for m in messages)
    finally:
        grouped.close()
        scanned.close()


def test_held_regions_by_model_agrees_with_held_regions() -> None:
    result = generated_round(random.Random(99), 40)
    grouped = result.held_regions_by_model()
    for md in {f.model_deployment for f in result.forecasts.values()}:
        assert grouped.get(md, []) == result.held_regions(md)
    assert all(grouped.values())


class CountingMapping(Mapping[K, V]):
    """Counts the entries read, by lookup or by iteration."""

    def __init__(self, data: dict[K, V]) -> None:
        self.data = data
        self.reads = 0

    def __getitem__(self, key: K) -> V:
        self.reads += 1
        return self.data[key]

    def __iter__(self) -> Iterator[K]:
        for key in self.data:
            self.reads += 1
            yield key

    def __len__(self) -> int:
        return len(self.data)


def reads_per_entry(n_mds: int) -> float:
    base = generated_round(random.Random(n_mds), n_mds)
    endpoints: CountingMapping[Any, Any] = CountingMapping(dict(base.endpoints))
    forecasts: CountingMapping[Any, Any] = CountingMapping(dict(base.forecasts))
    result = RoundResult(base.now_s, endpoints, forecasts, None, "optimal", None, 0.0, ())
    p = planner()
    try:
        p._apply(result, base.now_s, 3600.0)
    finally:
        p.close()
    return (endpoints.reads + forecasts.reads) / (len(endpoints) + len(forecasts))


def test_apply_reads_each_endpoint_and_forecast_a_constant_number_of_times() -> None:
    """The per-model scans read every entry once per ModelDeployment (hundreds of times here)."""
    small, large = reads_per_entry(10), reads_per_entry(300)
    assert large <= 3.0, large
    assert large == pytest.approx(small)
