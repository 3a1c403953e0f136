"""A ModelDeployment left out of a planning round loses its previous plan.

NotPlannable says "replicas hold"; before the fix the old target stayed in `Autoscaler.plans` (and
the `PlanBook`), and every reconcile walked the region toward it, hours or days after the plan was
made for a spec that no longer holds (r08: LT-I 2 -> 3 -> 4 -> 5 -> 6 after the user's edit).
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetwarden.metrics.client import PrometheusUnavailable
from fleetwarden.metrics.client import Series as PromSeries
from fleetwarden.operator.autoscaler import Autoscaler, RegionSignal
from fleetwarden.operator.fleet import FleetView, ObjectRecord, parse_model_deployment
from fleetwarden.operator.hourly_planner import FleetPlanner
from fleetwarden.operator.plan_status import NOT_PLANNABLE, PROMETHEUS_UNAVAILABLE, PlanBook

NOW = 1_800_000_000.0
A, B = ("ns/a", "p"), ("ns/b", "p")


class Prometheus:
    """30 h of a flat 30,000 tokens/s for both served models (the cheap last-peak path), no NIW;
    `down` makes every query fail as an unreachable server does."""

    down = False

    def range_series(
        self, query: str, start_s: float, end_s: float, step_s: float
    ) -> list[PromSeries]:
        if self.down:
            raise PrometheusUnavailable("connection refused")
        if "niw_tokens" in query:
            return []
        stamps = tuple(end_s - k * step_s for k in range(int(30 * 3600 / step_s)))[::-1]
        return [
            PromSeries({"model": served, "region": "r"}, stamps, (30_000.0,) * len(stamps))
            for served in ("a", "b")
        ]


def view(b_plannable: bool) -> FleetView:
    """Pool p (A100) and two LT-I ModelDeployments in it; b without an A100 throughput entry is
    NotPlannable (the user's edit of r08)."""
    pool = {
        "kind": "RegionPool",
        "metadata": {"name": "p", "uid": "p", "generation": 1},
        "spec": {"region": "r", "gpuType": "A100", "capacity": {"gpus": 64}, "costPerHour": 2},
    }
    mds: list[dict[str, Any]] = []
    for name in ("a", "b"):
        throughput = {"A100": 5000} if name == "a" or b_plannable else {"H100": 9800}
        mds.append(
            {
                "kind": "ModelDeployment",
                "metadata": {"name": name, "namespace": "ns", "uid": name, "generation": 1},
                "spec": {
                    "model": {"name": name, "gpusPerInstance": 1},
                    "throughput": throughput,
                    "regions": [{"pool": "p", "minInstances": 2, "maxInstances": 16}],
                    "scaling": {"strategy": "lt-i", "cooldownSeconds": 1},
                },
            }
        )
    return FleetView.of(
        pools=[ObjectRecord.from_body(pool)],
        model_deployments=[ObjectRecord.from_body(md) for md in mds],
    )


class Fleet:
    def __init__(self) -> None:
        self.prometheus = Prometheus()
        self.autoscaler, self.book = Autoscaler(), PlanBook()
        self.current = view(b_plannable=True)
        self.planner = FleetPlanner(
            self.prometheus,  # type: ignore[arg-type]  # duck-typed: range_series only
            self.autoscaler,
            self.book,
            lambda: self.current,
            lambda key: None,
            clock=lambda: NOW,
        )

    def reconciles(self, key: str, replicas: int, n: int) -> list[int]:
        """Replicas after each of `n` reconciles of `key` in pool p (fresh signal, cooled down)."""
        spec = parse_model_deployment(self.current.model_deployments[key]).spec
        assert spec is not None
        placement = spec.regions[0]
        seen = []
        for i in range(n):
            t = NOW + 10 + 2 * i
            self.autoscaler.signals[(key, "p")] = RegionSignal(t, 0.5, 30_000.0)
            step = self.autoscaler.step(key, spec, placement, replicas, t)
            assert step is not None
            replicas = step.after
            seen.append(replicas)
        return seen


@pytest.fixture
def fleet() -> Any:
    f = Fleet()
    yield f
    f.planner.close()


async def test_a_skipped_model_deployment_drops_its_plan_and_holds(fleet: Fleet) -> None:
    assert await fleet.planner.plan_once()
    assert fleet.autoscaler.plans[B].target == 6  # 30,000 tokens/s / 5000 per instance
    assert fleet.book.records_of("ns/b")

    fleet.current = view(b_plannable=False)
    assert await fleet.planner.plan_once()
    health = fleet.book.health_of("ns/b")
    assert health is not None
    assert health.reason == NOT_PLANNABLE
    assert B not in fleet.autoscaler.plans
    assert fleet.book.records_of("ns/b") == {}
    assert fleet.reconciles("ns/b", replicas=2, n=4) == [2, 2, 2, 2]  # was 3, 4, 5, 6
    assert fleet.autoscaler.plans[A].target == 6  # the rest of the fleet keeps planning

    fleet.current = view(b_plannable=True)  # fixed: planned again
    assert await fleet.planner.plan_once()
    assert fleet.autoscaler.plans[B].target == 6


async def test_the_plan_is_dropped_even_when_the_round_fails(fleet: Fleet) -> None:
    """Prometheus down keeps the previous plans in force (fail static), but not the plan of a
    ModelDeployment that can no longer be planned at all."""
    assert await fleet.planner.plan_once()
    fleet.current = view(b_plannable=False)
    fleet.prometheus.down = True
    assert not await fleet.planner.plan_once()
    health = fleet.book.health_of("ns/b")
    assert health is not None
    assert health.reason == PROMETHEUS_UNAVAILABLE
    assert fleet.autoscaler.plans[A].target == 6
    assert B not in fleet.autoscaler.plans
    assert fleet.book.records_of("ns/b") == {}
    assert fleet.reconciles("ns/b", replicas=2, n=2) == [2, 2]
