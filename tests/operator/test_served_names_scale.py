"""The served-name check does not grow with the fleet per reconcile.

It runs on every ModelDeployment reconcile. Re-parsing each pool for every ModelDeployment naming
it made a call cost (ModelDeployments x placements) pool parses, and scanning every spec for each
reconcile made a resync of the fleet quadratic (3-4 ms per call at 2,000). With the runtime's
`ServedNameIndex`, a resync reads each ModelDeployment once in all, and a reconcile looks only at
those sharing its served name. Parse calls are counted, not timed.
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


def _conflicts(
    view: FleetView, record: ObjectRecord, index: served_names.ServedNameIndex | None = None
) -> list[str]:
    spec = parse_model_deployment(record).spec
    assert spec is not None
    return served_names.served_name_conflicts(view, record, spec, index)


def test_a_large_fleet_is_parsed_once_per_object_per_call(parses: Counter[str]) -> None:
    """Without an index (one-off callers): linear, every pool parsed once, not per placement."""
    pools = _pools()
    names = [p.key for p in pools]
    fleet = [_md(i, names) for i in range(FLEET)]  # all one served name, all in every pool
    view = FleetView.of(pools, fleet)

    newest = _conflicts(view, fleet[-1])
    assert len(newest) == FLEET - 1  # told about every older one
    assert newest[0].startswith("ModelDeployment team-00000/llama-3-70b (older)")
    assert parses["parse_model_deployment"] <= FLEET
    assert parses["parse_pool"] <= len(pools)  # was FLEET x len(pools)


def test_a_resync_through_the_index_reads_each_model_deployment_once(
    parses: Counter[str],
) -> None:
    """Every ModelDeployment reconciled in turn, as a resync does, with distinct served names:
    each is parsed once in all (was once per reconcile: FLEET squared), no pool is parsed (no
    one has a rival), and a second resync of the unchanged fleet parses nothing."""
    pools = _pools()
    names = [p.key for p in pools]
    fleet = [_md(i, names, served=f"model-{i}") for i in range(FLEET)]
    view = FleetView.of(pools, fleet)
    index = served_names.ServedNameIndex()

    assert all(_conflicts(view, record, index) == [] for record in fleet)
    assert parses["parse_model_deployment"] == FLEET
    assert parses["parse_pool"] == 0
    parses.clear()
    assert all(_conflicts(view, record, index) == [] for record in fleet)
    assert parses["parse_model_deployment"] == 0
    assert len(index) == FLEET


def test_the_index_follows_renames_deletions_and_new_records() -> None:
    """Changes reach the index through new record objects (a watch event), not through hooks."""
    pools = _pools()
    names = [p.key for p in pools]
    old, new = _md(0, names), _md(1, names, served="other")
    index = served_names.ServedNameIndex()
    assert _conflicts(FleetView.of(pools, [old, new]), new, index) == []
    renamed = _md(1, names)  # the same object, now serving the older one's name
    [message] = _conflicts(FleetView.of(pools, [old, renamed]), renamed, index)
    assert "team-00000/llama-3-70b (older)" in message
    assert _conflicts(FleetView.of(pools, [renamed]), renamed, index) == []  # the older one left
    assert len(index) == 1
    back = _md(1, names, served="other")
    newer = _md(2, names)
    view = FleetView.of(pools, [old, back, newer])
    assert _conflicts(view, back, index) == []
    [message] = _conflicts(view, newer, index)  # told about team-00000, not the renamed one
    assert "team-00000/llama-3-70b (older)" in message


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
