"""The instance's fast path for a lone arrival (`Instance._start_alone`, the policy's `push_pop`)
against the general path (push, admission, prefill): the same run, request for request."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetwarden.api.enums import ScalingStrategy
from fleetwarden.fairness.vtc import VirtualTokenCounter
from fleetwarden.fairness.wsc import WeightedServiceCounter
from fleetwarden.sim.cluster import SimOptions, simulate
from fleetwarden.sim.fleet_spec import load_fleet
from fleetwarden.sim.workload_builtin import BuiltinWorkload

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _busy_run() -> str:
    """The benchmark's scenario, shorter: busy enough that queues form now and then, so both
    paths run in one simulation."""
    fleet = load_fleet(EXAMPLES)
    duration = 240.0
    requests = list(BuiltinWorkload(duration_s=duration, start_hour=14.0).build(fleet))
    initial = {
        (m.key, p.pool): max(p.min_instances, math.ceil(0.7 * p.max_instances))
        for m in fleet.models.values()
        for p in m.placements
    }
    options = SimOptions(
        duration_s=duration,
        strategy=ScalingStrategy.LT_UA,
        initial_instances=initial,
        keep_requests=True,
    )
    return simulate(fleet, requests, options).to_json()


def test_lone_arrivals_take_the_fast_path_with_the_same_outcomes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = {"vtc": 0, "wsc": 0}

    def counting(kind: str, original: Callable[..., None]) -> Callable[..., None]:
        def push_pop(self: object, request: object, now: float) -> None:
            taken[kind] += 1
            original(self, request, now)

        return push_pop

    monkeypatch.setattr(
        VirtualTokenCounter, "push_pop", counting("vtc", VirtualTokenCounter.push_pop)
    )
    monkeypatch.setattr(
        WeightedServiceCounter, "push_pop", counting("wsc", WeightedServiceCounter.push_pop)
    )
    fast = _busy_run()
    assert taken["vtc"] > 0  # the fast path ran (else this comparison could not fail)
    assert taken["wsc"] > 0
    monkeypatch.delattr(VirtualTokenCounter, "push_pop")
    monkeypatch.delattr(WeightedServiceCounter, "push_pop")
    assert _busy_run() == fast
