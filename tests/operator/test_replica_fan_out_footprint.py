"""Which changes of a ModelDeployment reach whom: the footprint the runtime fans out on.

The selection (generation, labels, pools in status) wakes pools, TenantPolicies and rivals; the
accounted demands (replicas and GPUs per instance per pool) only the pools whose allocation moved
and their Degraded younger sharers; anything else (readiness, conditions) no one.
"""

from __future__ import annotations

import copy
from typing import Any

from fleetwarden.operator.fleet import ObjectRecord
from fleetwarden.operator.runtime import accounting_changes, footprint
from tests.operator.fixtures import example, record

EAST, WEST, EU = "us-east-a100", "us-west-a100", "eu-west-h100"


def _status(current: dict[str, int], ready: int = 0, degraded: bool = False) -> dict[str, Any]:
    return {
        "regions": [{"pool": pool, "current": n, "ready": ready} for pool, n in current.items()],
        "conditions": [{"type": "Degraded", "status": str(degraded), "reason": "X"}],
    }


def _llama(status: dict[str, Any], generation: int = 1, **spec: Any) -> ObjectRecord:
    body = example("ModelDeployment", "llama-3-70b")
    body["spec"].update(copy.deepcopy(spec))
    return record(body, generation=generation, status=status)


RUNNING = {EAST: 2, WEST: 1, EU: 1}


def test_a_status_write_that_moves_no_replicas_leaves_the_footprint_equal() -> None:
    before = footprint(_llama(_status(RUNNING)))
    after = footprint(_llama(_status(RUNNING, ready=1, degraded=True)))
    assert after == before


def test_a_scaling_step_changes_only_the_demands_of_its_pool() -> None:
    before = footprint(_llama(_status(RUNNING)))
    after = footprint(_llama(_status({**RUNNING, EAST: 5})))
    assert after.selection == before.selection  # no TenantPolicy or served-name rival to wake
    assert after.demands != before.demands
    assert accounting_changes(before, after) == [EAST]
    assert accounting_changes(after, before) == [EAST]


def test_a_change_of_gpus_per_instance_reaches_every_pool_of_it() -> None:
    """Read from the spec (CRD defaults can change it without a new generation)."""
    model = {**example("ModelDeployment", "llama-3-70b")["spec"]["model"], "gpusPerInstance": 8}
    before = footprint(_llama(_status(RUNNING)))
    after = footprint(_llama(_status(RUNNING), model=model))
    assert after.selection == before.selection
    assert accounting_changes(before, after) == sorted([EAST, WEST, EU])


def test_generation_and_labels_change_the_selection() -> None:
    base = _llama(_status(RUNNING))
    assert footprint(_llama(_status(RUNNING), generation=2)).selection != footprint(base).selection
    body = example("ModelDeployment", "llama-3-70b")
    body["metadata"]["labels"] = {"team": "other"}
    relabelled = record(body, status=_status(RUNNING))
    assert footprint(relabelled).selection != footprint(base).selection
    assert footprint(relabelled).demands == footprint(base).demands


def test_an_invalid_spec_counts_what_its_status_says_runs() -> None:
    """While invalid the accounting holds the replicas in status; their change must reach too."""
    regions = [{"pool": EAST, "minInstances": 9, "maxInstances": 1}]  # fails the model only
    before = footprint(_llama(_status({EAST: 3}), regions=regions))
    after = footprint(_llama(_status({EAST: 1}), regions=regions))
    assert before.demands == ((EAST, 3, 4),)
    assert accounting_changes(before, after) == [EAST]
