"""Pool accounting: sums, free capacity, and who is told about an overcommit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleetwarden.api.v1alpha1 import RegionPoolSpec
from fleetwarden.operator.allocation import Demand, account


def _pool(gpus: int | None = 8, instances: int | None = None) -> RegionPoolSpec:
    capacity = {k: v for k, v in (("gpus", gpus), ("instances", instances)) if v is not None}
    return RegionPoolSpec.model_validate(
        {"region": "r", "gpuType": "A100", "capacity": capacity, "costPerHour": 1}
    )


def test_usage_sums_instances_and_gpus_per_model() -> None:
    result = account(
        {"p": _pool(gpus=16)},
        [
            Demand("ns/a", "2026-01-01", "p", instances=2, gpus_per_instance=4),
            Demand("ns/b", "2026-01-02", "p", instances=3, gpus_per_instance=1),
        ],
    )
    usage = result.usage["p"]
    assert usage.allocations == {"ns/a": (2, 8), "ns/b": (3, 3)}
    assert (usage.instances, usage.gpus, usage.free_gpus, usage.free_instances) == (5, 11, 5, None)
    assert result.shortfalls == ()


def test_the_later_arrival_is_told_about_the_overcommit() -> None:
    result = account(
        {"p": _pool(gpus=8)},
        [
            Demand("ns/late", "2026-01-02", "p", instances=2, gpus_per_instance=2),
            Demand("ns/early", "2026-01-01", "p", instances=3, gpus_per_instance=2),
        ],
    )
    assert [s.model_deployment for s in result.shortfalls] == ["ns/late"]
    assert "10 GPUs placed, capacity 8" in result.shortfalls[0].message
    assert result.usage["p"].overcommitted


def test_instance_capacity_counts_instances_whatever_their_size() -> None:
    result = account({"p": _pool(gpus=None, instances=2)}, [Demand("ns/a", "t", "p", 3, 8)])
    assert result.usage["p"].free_instances == -1
    assert result.usage["p"].free_gpus is None
    assert len(result.shortfalls) == 1


def test_demands_on_unknown_pools_are_ignored_here() -> None:
    result = account({"p": _pool()}, [Demand("ns/a", "t", "missing", 1, 1)])
    assert result.usage["p"].instances == 0
    assert result.shortfalls == ()


@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(1, 4)), min_size=0, max_size=8),
    st.integers(1, 40),
)
def test_shortfalls_exactly_when_capacity_is_exceeded(
    demands: list[tuple[int, int]], gpus: int
) -> None:
    items = [Demand(f"ns/m{i}", f"t{i:02d}", "p", n, g) for i, (n, g) in enumerate(demands)]
    result = account({"p": _pool(gpus=gpus)}, items)
    total = sum(n * g for n, g in demands)
    assert result.usage["p"].gpus == total
    assert result.usage["p"].free_gpus == gpus - total
    assert bool(result.shortfalls) == (total > gpus)
    # Only demands that arrived once the pool was full are blamed.
    running = 0
    blamed = {s.model_deployment for s in result.shortfalls}
    for item in items:
        running += item.gpus
        assert (item.model_deployment in blamed) == (running > gpus and item.instances > 0)
