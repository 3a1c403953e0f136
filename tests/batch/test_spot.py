"""Spot replica sizing (pure): zero without backlog, bounded, driven by deadline pressure."""

from __future__ import annotations

import pytest

from fleetwarden.batch.spot import SpotDemand, SpotSizing, spot_replicas

SIZING = SpotSizing(items_per_replica_per_s=1.0, max_replicas=10, drain_s=None)


def test_nothing_queued_means_no_spot_replicas() -> None:
    urgent = SpotDemand(backlog_items=0, due=((60.0, 0),))
    assert spot_replicas(urgent, SIZING).replicas == 0


def test_deadline_pressure_sets_the_count() -> None:
    # 3600 items due within the hour need 1 item/s; shared capacity gives none
    demand = SpotDemand(backlog_items=3600, due=((3600.0, 3600), (86400.0, 3600)))
    decision = spot_replicas(demand, SIZING)
    assert decision.replicas == 1
    assert decision.needed_items_per_s == pytest.approx(1.0)
    assert decision.at_risk_items == 3600


def test_the_tightest_horizon_wins_and_shared_capacity_is_subtracted() -> None:
    demand = SpotDemand(
        backlog_items=10_000,
        due=((3600.0, 7200), (7200.0, 9000), (86400.0, 10_000)),
        shared_items_per_s=0.5,
    )
    decision = spot_replicas(demand, SIZING)
    assert decision.needed_items_per_s == pytest.approx(2.0)
    assert decision.replicas == 2  # ceil(2.0 - 0.5)
    assert decision.at_risk_items == 7200 - 1800


def test_no_pressure_and_no_drain_target_needs_no_spot() -> None:
    demand = SpotDemand(backlog_items=100, due=((86400.0, 100),), shared_items_per_s=1.0)
    assert spot_replicas(demand, SIZING).replicas == 0


def test_the_drain_horizon_follows_the_backlog() -> None:
    sizing = SpotSizing(items_per_replica_per_s=0.5, max_replicas=10, drain_s=3600.0)
    assert spot_replicas(SpotDemand(backlog_items=1), sizing).replicas == 1
    assert spot_replicas(SpotDemand(backlog_items=5400), sizing).replicas == 3


def test_the_maximum_holds_and_due_now_items_do_not_ask_for_infinity() -> None:
    demand = SpotDemand(backlog_items=10**6, due=((0.001, 10**6),))
    assert spot_replicas(demand, SIZING).replicas == 10
    expired = SpotDemand(backlog_items=5, due=((-10.0, 5),))
    assert spot_replicas(expired, SIZING).replicas == 0
    assert spot_replicas(demand, SpotSizing(1.0, max_replicas=0)).replicas == 0


def test_bad_sizing_is_refused() -> None:
    with pytest.raises(ValueError, match="items_per_replica"):
        spot_replicas(SpotDemand(1), SpotSizing(0.0, 1))
