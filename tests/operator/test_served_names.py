"""Which ModelDeployments are told they share a served name and region with an older one."""

from __future__ import annotations

import copy
from typing import Any

from fleetwarden.operator.fleet import FleetView, ObjectRecord, parse_model_deployment
from fleetwarden.operator.served_names import served_name_conflicts
from tests.operator.fixtures import example, example_objects


def _md(namespace: str, created: str, pools: list[str], served: str = "llama-3-70b") -> Any:
    body = copy.deepcopy(example("ModelDeployment", "llama-3-70b"))
    body["metadata"].update({"namespace": namespace, "creationTimestamp": created})
    body["spec"]["model"]["servedName"] = served
    body["spec"]["regions"] = [{"pool": p, "minInstances": 1, "maxInstances": 2} for p in pools]
    return ObjectRecord.from_body(body)


def _conflicts(view: FleetView, record: ObjectRecord) -> list[str]:
    spec = parse_model_deployment(record).spec
    assert spec is not None
    return served_name_conflicts(view, record, spec)


def test_only_the_later_of_two_in_a_shared_region_is_told_across_namespaces() -> None:
    pools = [ObjectRecord.from_body(o) for o in example_objects() if o["kind"] == "RegionPool"]
    old = _md("team-a", "2026-01-01T00:00:00Z", ["us-east-a100", "us-west-a100"])
    new = _md("team-b", "2026-02-01T00:00:00Z", ["us-west-a100", "eu-west-h100"])
    elsewhere = _md("team-c", "2026-03-01T00:00:00Z", ["eu-west-h100"])
    renamed = _md("team-d", "2026-04-01T00:00:00Z", ["us-east-a100"], served="llama-canary")
    view = FleetView.of(pools, [old, new, elsewhere, renamed])
    assert _conflicts(view, old) == []
    [message] = _conflicts(view, new)
    assert message.startswith("ModelDeployment team-a/llama-3-70b (older)")
    assert "in us-west:" in message  # only the region they share
    # team-c shares eu-west with team-b only: told about team-b, not about team-a
    [message] = _conflicts(view, elsewhere)
    assert "team-b/llama-3-70b" in message
    assert _conflicts(view, renamed) == []
