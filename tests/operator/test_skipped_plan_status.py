"""The status of a ModelDeployment without a plan in force says so (`plan_status`).

The planner drops the plan of a ModelDeployment it leaves out (test_skipped_plan.py), but
`apply_plan_status` wrote only regions with a record: `target`, `lastForecastPeak` and the plan
times stayed, and so did `ForecastHealthy=True/Arima`. The reconciler end to end is in
test_skipped_plan_status_e2e.py.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from fleetwarden.metrics.client import Series as PromSeries
from fleetwarden.operator import plan_status
from fleetwarden.operator.conditions import ConditionUpdate, merge_conditions
from fleetwarden.operator.plan_status import (
    FORECAST_HEALTHY,
    NO_HISTORY,
    NOT_PLANNABLE,
    PLANNED,
    PROMETHEUS_UNAVAILABLE,
    PlanBook,
    apply_plan_status,
)
from tests.operator.test_skipped_plan import NOW, Fleet, Prometheus, view

PLAN_FIELDS = {"target", "lastForecastPeak", "lastForecastTime", "lastPlanTime"}


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    f = Fleet()
    yield f
    f.planner.close()


def planned_region(fleet: Fleet, key: str) -> dict[str, Any]:
    """Region p of `key` as the reconcile writes it after a round that planned it."""
    region: dict[str, Any] = {"pool": "p", "current": 2, "ready": 2}
    apply_plan_status(fleet.book, key, [region])
    assert region["target"] == 6
    assert set(region) >= PLAN_FIELDS
    return region


def by_type(updates: list[ConditionUpdate]) -> dict[str, ConditionUpdate]:
    return {u.type: u for u in updates}


async def test_a_left_out_model_deployment_shows_no_plan_and_why(fleet: Fleet) -> None:
    assert await fleet.planner.plan_once()
    region = planned_region(fleet, "ns/b")
    fleet.current = view(b_plannable=False)
    assert await fleet.planner.plan_once()

    updates, event = apply_plan_status(fleet.book, "ns/b", [region])
    assert region == {"pool": "p", "current": 2, "ready": 2}  # as before any plan
    assert event is None
    conditions = by_type(updates)
    assert set(conditions) == {PLANNED, FORECAST_HEALTHY}
    for condition in conditions.values():
        assert (condition.status, condition.reason) == (False, NOT_PLANNABLE)
        assert "no throughput for GPU type A100 of pool p" in condition.message
    assert conditions[FORECAST_HEALTHY].message.startswith("no forecast in force: ")

    # Later rounds of the same fleet: the same status, so the reconcile writes nothing.
    written = merge_conditions([], updates, now="t0", generation=1)
    assert await fleet.planner.plan_once()
    again = [dict(region)]
    later, _ = apply_plan_status(fleet.book, "ns/b", again)
    assert again == [region]
    assert merge_conditions(written, later, now="t1", generation=1) == written


async def test_a_plan_dropped_during_an_outage_is_not_shown(fleet: Fleet) -> None:
    """Prometheus down keeps the other plans in force (fail static) and says so fleet-wide;
    a ModelDeployment whose plan was dropped meanwhile is told it has none."""
    assert await fleet.planner.plan_once()
    a, b = planned_region(fleet, "ns/a"), planned_region(fleet, "ns/b")
    fleet.current = view(b_plannable=False)
    fleet.prometheus.down = True
    assert not await fleet.planner.plan_once()

    kept = copy.deepcopy(a)
    a_updates, _ = apply_plan_status(fleet.book, "ns/a", [a])
    assert a == kept
    assert by_type(a_updates)[PLANNED].message.endswith("the previous plan stays in force")

    updates, _ = apply_plan_status(fleet.book, "ns/b", [b])
    assert PLAN_FIELDS.isdisjoint(b)
    conditions = by_type(updates)
    for condition in conditions.values():
        assert (condition.status, condition.reason) == (False, PROMETHEUS_UNAVAILABLE)
        assert condition.message.endswith("; this ModelDeployment has no plan in force")


class SilentOnB(Prometheus):
    """b's series is gone from Prometheus: its region is held."""

    def range_series(
        self, query: str, start_s: float, end_s: float, step_s: float
    ) -> list[PromSeries]:
        found = super().range_series(query, start_s, end_s, step_s)
        return [s for s in found if s.labels.get("model") != "b"]


async def test_a_held_region_drops_the_peak_of_an_older_forecast(fleet: Fleet) -> None:
    """Held for lack of data, a region shows the new plan's times and target (its replicas)
    next to an old forecast's peak: this forecast expected none."""
    assert await fleet.planner.plan_once()
    region = planned_region(fleet, "ns/b")
    fleet.planner.client = SilentOnB()
    fleet.planner.clock = lambda: NOW + 3600.0  # the next hour's round
    assert await fleet.planner.plan_once()
    updates, event = apply_plan_status(fleet.book, "ns/b", [region])
    assert "lastForecastPeak" not in region
    assert (region["target"], region["current"]) == (2, 2)
    assert event is not None
    assert "no data, held" in event
    assert by_type(updates)[PLANNED].reason == NO_HISTORY


def test_before_the_first_round_a_status_is_left_as_it_is() -> None:
    """An operator that just started has no word on anything yet: the previous process's plan
    stays shown until the first round (at once), rather than a write and a write back."""
    region = {"pool": "p", "current": 2, "target": 6, "lastPlanTime": "2027-01-15T08:00:00Z"}
    kept = dict(region)
    assert apply_plan_status(PlanBook(), "ns/b", [region]) == ([], None)
    assert region == kept


async def test_the_regions_of_an_invalid_spec_lose_their_plan(fleet: Fleet) -> None:
    """What the reconcile of an invalid spec writes: the last regions without the plan fields,
    no `targetInstances`, and the conditions; nothing without a plan book."""
    assert await fleet.planner.plan_once()
    status = {"regions": [planned_region(fleet, "ns/b")], "targetInstances": 6}
    kept_regions_plan_status = plan_status.kept_regions_plan_status  # new with the fix
    assert kept_regions_plan_status(None, "ns/b", status) == ({}, [])
    fleet.current = view(b_plannable=False)
    assert await fleet.planner.plan_once()
    fields, updates = kept_regions_plan_status(fleet.book, "ns/b", status)
    assert fields == {
        "regions": [{"pool": "p", "current": 2, "ready": 2}],
        "targetInstances": None,  # a merge patch removes it
    }
    assert {(u.type, u.reason) for u in updates} == {
        (PLANNED, NOT_PLANNABLE),
        (FORECAST_HEALTHY, NOT_PLANNABLE),
    }
    assert status["regions"][0]["target"] == 6  # the record's status is not touched
