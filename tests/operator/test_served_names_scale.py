"""`served_name_conflicts` stays linear in the fleet: one parse per ModelDeployment and per pool.

It runs on every ModelDeployment reconcile; re-parsing each pool for every ModelDeployment naming
it made a call cost (ModelDeployments x placements) pool parses. Parse calls are counted, not timed.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

import pytest

import fleetwarden.operator.served_names as served_names
from fleetwarden.operator.fleet import FleetView, ObjectRecord, parse_model_deployment
from tests.operator.fixtures import example, example_objects

FLEET = 2_000
T = TypeVar("T")


def _pools() -> list[ObjectRecord]:
    return [ObjectRecord.from_body(o) for o in example_objects() if o["kind"] == "RegionPool"]


@cache
def _example_md() -> dict[str, Any]:
    return example("ModelDeployment", "llama-3-70b")


def _md(index: int, pools: list[str], served: str = "llama-3-70b") -> ObjectRecord:
    body = copy.deepcopy(_example_md())
    created = f"2026-01-01T{index // 3600:02d}:{index // 60 % 60:02d}:{index % 60:02d}Z"
    body["metadata"].update({"namespace": f"team-{index:05d}", "creationTimestamp": created})
    body["spec"]["model"]["servedName"] = served
    body["spec"]["regions"] = [{"pool": p, "minInstances": 1, "maxInstances": 2} for p in pools]
    return ObjectRecord.from_body(body)


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Calls of the parsers `served_name_conflicts` uses, by parser name."""
    counts: Counter[str] = Counter()

    def counting(name: str, parse: Callable[[ObjectRecord], T]) -> Callable[[ObjectRecord], T]:
        def wrapper(record: ObjectRecord) -> T:
            counts[name] += 1
            return parse(record)

        return wrapper

    for name in ("parse_model_deployment", "parse_pool"):
        monkeypatch.setattr(served_names, name, counting(name, getattr(served_names, name)))
    return counts


def _conflicts(view: FleetView, record: ObjectRecord) -> list[str]:
    spec = parse_model_deployment(record).spec
    assert spec is not None
    return served_names.served_name_conflicts(view, record, spec)


def test_a_large_fleet_is_parsed_once_per_object_per_call(parses: Counter[str]) -> None:
    pools = _pools()
    names = [p.key for p in pools]
    fleet = [_md(i, names) for i in range(FLEET)]  # all one served name, all in every pool
    view = FleetView.of(pools, fleet)

    newest = _conflicts(view, fleet[-1])
    assert len(newest) == FLEET - 1  # told about every older one
    assert newest[0].startswith("ModelDeployment team-00000/llama-3-70b (older)")
    assert parses["parse_model_deployment"] <= FLEET  # was already linear; must stay so
    assert parses["parse_pool"] <= len(pools)  # was FLEET x len(pools)

    parses.clear()
    assert _conflicts(view, fleet[0]) == []  # the oldest: nothing earlier, nothing parsed
    assert parses["parse_model_deployment"] == 0


def test_invalid_and_missing_pools_still_share_no_region(parses: Counter[str]) -> None:
    pools = _pools()
    broken: dict[str, Any] = copy.deepcopy(
        next(o for o in example_objects() if o["metadata"]["name"] == "us-west-a100")
    )
    broken["metadata"]["name"] = "broken-pool"
    broken["spec"]["region"] = "us-west"
    broken["spec"]["capacity"] = "not a capacity"
    pools.append(ObjectRecord.from_body(broken))
    old = _md(0, ["broken-pool", "no-such-pool", "us-west-a100"])
    mid = _md(1, ["broken-pool", "no-such-pool"])
    new = _md(2, ["broken-pool", "us-west-a100", "eu-west-h100"])
    view = FleetView.of(pools, [old, mid, new])
    assert _conflicts(view, mid) == []  # an invalid or missing pool is in no region
    [message] = _conflicts(view, new)
    assert message.startswith("ModelDeployment team-00000/llama-3-70b (older)")
    assert "in us-west:" in message
