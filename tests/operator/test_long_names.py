"""Names longer than a label value: every ModelDeployment and pool gets a label value of its own.

Before, a label value was the name cut to 63 characters, so two ModelDeployments whose names
share their first 63 characters shared their selectors (each Service sent traffic to both models'
pods) and the config pusher gave one model's pods to the other. These tests pin the values of
names that fit (existing Deployments' selectors hold them and cannot change) and check that the
pieces acting on a label-selected list also check ownership. The operator end to end is in
test_long_names_e2e.py.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetwarden.operator import builders, naming
from fleetwarden.operator.applier import ControlledElsewhereError, check_controller
from fleetwarden.operator.conditions import LEGACY_SELECTOR
from fleetwarden.operator.config_push import ConfigPusher, DesiredConfig, owned_pod
from fleetwarden.operator.drift import drifted_paths
from fleetwarden.operator.reconcilers.modeldeployment import (
    Problem,
    _condition_updates,
    _RegionOutcome,
)
from fleetwarden.operator.spot_deployments import build_spot_deployment
from tests.operator.fixtures import region_target
from tests.support.kube_selectors import parse_label_selector

PREFIX = "llama-" + "x" * 57  # 63 characters
ONE, TWO = f"{PREFIX}-one", f"{PREFIX}-two"
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_LABEL = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


def test_names_that_fit_keep_their_values_byte_for_byte() -> None:
    for name in ("mistral-7b", "llama-3-70b", "us-east-a100", "a", "x" * 63, "a.b_c-d"):
        assert naming.label_value(name) == name == naming.legacy_label_value(name)
    assert naming.selector_labels("mistral-7b", "us-east-a100") == {
        "fleetwarden.dev/model-deployment": "mistral-7b",
        "fleetwarden.dev/pool": "us-east-a100",
    }
    assert naming.child_labels("llama-3-70b", "eu-west-h100", "eu-west", "H100-80GB") == {
        "app.kubernetes.io/managed-by": "fleetwarden",
        "app.kubernetes.io/part-of": "fleetwarden",
        "app.kubernetes.io/component": "serving",
        "fleetwarden.dev/model-deployment": "llama-3-70b",
        "fleetwarden.dev/pool": "eu-west-h100",
        "fleetwarden.dev/region": "eu-west",
        "fleetwarden.dev/gpu-type": "H100-80GB",
    }
    assert naming.children_selector("mistral-7b") == (
        "app.kubernetes.io/managed-by=fleetwarden,fleetwarden.dev/model-deployment=mistral-7b"
    )


@given(DNS_LABEL)
def test_every_dns_label_keeps_its_value(name: str) -> None:
    """Pool names are DNS labels, ModelDeployment names up to 63 characters too: unchanged."""
    assert naming.label_value(name) == name == naming.legacy_label_value(name)
    assert naming.model_deployment_label_values(name) == [name]


def test_names_sharing_63_characters_get_distinct_stable_values() -> None:
    assert naming.legacy_label_value(ONE) == naming.legacy_label_value(TWO) == PREFIX  # the bug
    one, two = naming.label_value(ONE), naming.label_value(TWO)
    assert one != two
    assert one == "llama-" + "x" * 48 + "-6cc809f5"  # stable across versions: in selectors
    for value in (one, two):
        assert len(value) <= 63
        assert LABEL_VALUE.match(value)
    assert naming.selector_labels(ONE, "us-east-a100") != naming.selector_labels(
        TWO, "us-east-a100"
    )
    long_pool = "pool-" + "y" * 70
    assert naming.label_value(long_pool) != naming.label_value(long_pool + "z")


@given(st.text(max_size=300))
def test_any_text_becomes_a_valid_label_value(text: str) -> None:
    value = naming.label_value(text)
    assert len(value) <= 63
    assert LABEL_VALUE.match(value), value
    assert naming.label_value(text) == value
    assert LABEL_VALUE.match(naming.descriptive_label_value(text))


def test_a_long_name_lists_children_by_both_values() -> None:
    """Its Deployments from before unique values keep the old value (selectors are immutable),
    so their pods are listed too; the list may hold another's, hence the ownership checks."""
    selector = parse_label_selector(naming.children_selector(ONE))

    def matches(value: str) -> bool:
        labels = {naming.MANAGED_BY: naming.MANAGER, naming.MODEL_DEPLOYMENT_LABEL: value}
        return selector({"metadata": {"labels": labels}})

    assert matches(naming.label_value(ONE))
    assert matches(PREFIX)
    assert not matches(naming.label_value(TWO))


def _long_target() -> builders.RegionTarget:
    target = region_target()
    return dataclasses.replace(target, owner=dataclasses.replace(target.owner, name=ONE))


def _legacy(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as the operator before unique values wrote it: the cut name in every label."""
    text = json.dumps(obj).replace(f'"{naming.label_value(ONE)}"', f'"{PREFIX}"')
    result: dict[str, Any] = json.loads(text)
    return result


def test_a_deployment_from_before_unique_values_keeps_its_selector_and_pod_labels() -> None:
    target = _long_target()
    desired = builders.build_deployment(target)
    live = _legacy(desired)
    assert live["spec"]["selector"] != desired["spec"]["selector"]
    kept = builders.keep_selector(desired, live)
    assert kept["spec"]["selector"] == live["spec"]["selector"]
    assert kept["spec"]["template"] == live["spec"]["template"]  # no rollout
    owned = {k: v for k, v in kept.items() if k not in ("apiVersion", "kind")}
    drift = drifted_paths(owned, live)
    assert drift
    assert all(p.startswith(".metadata.labels") for p in drift), drift
    assert kept["metadata"]["labels"] == desired["metadata"]["labels"]  # found by the new value
    assert desired == builders.build_deployment(target)  # not changed in place

    spot = build_spot_deployment(target, 2)
    legacy_spot = _legacy(spot)
    kept_spot = builders.keep_selector(spot, legacy_spot)
    assert kept_spot["spec"]["selector"] == legacy_spot["spec"]["selector"]
    assert kept_spot["spec"]["template"] == legacy_spot["spec"]["template"]


def test_keep_selector_leaves_a_current_or_foreign_deployment_alone() -> None:
    desired = builders.build_deployment(_long_target())
    assert builders.keep_selector(desired, copy.deepcopy(desired)) is desired
    foreign = copy.deepcopy(desired)
    foreign["spec"]["selector"] = {"matchExpressions": [{"key": "a", "operator": "Exists"}]}
    assert builders.plain_selector(foreign) is None
    assert builders.keep_selector(desired, foreign) is desired


def test_the_message_says_how_to_migrate() -> None:
    message = builders.kept_selector_message("d", {naming.MODEL_DEPLOYMENT_LABEL: PREFIX})
    assert f"fleetwarden.dev/model-deployment={PREFIX}" in message
    assert "predates unique selectors" in message
    assert "kubectl delete deployment d" in message


def _pod(name: str, label: str, controller: dict[str, Any] | None, ready: bool = False) -> Any:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "labels": {naming.MODEL_DEPLOYMENT_LABEL: label, "pod-template-hash": "5d8f7"},
    }
    if controller is not None:
        metadata["ownerReferences"] = [{"controller": True, **controller}]
    return {
        "metadata": metadata,
        "spec": {
            "containers": [{"name": "sidecar", "ports": [{"name": "http", "containerPort": 1}]}]
        },
        "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": str(ready)}]},
    }


def test_a_pod_belongs_to_the_deployment_whose_replica_set_controls_it() -> None:
    mine = naming.child_name(ONE, "us-east-a100")
    theirs = naming.child_name(TWO, "us-east-a100")
    label = naming.label_value(ONE)
    rs = "ReplicaSet"
    assert owned_pod(_pod("a", PREFIX, {"kind": rs, "name": f"{mine}-5d8f7"}), {mine}, label)
    assert not owned_pod(_pod("b", PREFIX, {"kind": rs, "name": f"{theirs}-5d8f7"}), {mine}, label)
    assert not owned_pod(_pod("c", PREFIX, {"kind": rs, "name": f"{mine}-other"}), {mine}, label)
    assert not owned_pod(_pod("d", PREFIX, {"kind": "StatefulSet", "name": mine}), {mine}, label)
    assert owned_pod(_pod("e", label, None), {mine}, label)  # nothing controls it: by label
    assert not owned_pod(_pod("f", PREFIX, None), {mine}, label)  # a shared, old value


async def test_the_pusher_counts_each_listed_pod_for_the_model_deployment_that_listed_it() -> None:
    """Both carry the old, shared value; each reconcile lists (and checks) its own pods."""
    pusher = ConfigPusher()
    for key in (f"ns/{ONE}", f"ns/{TWO}"):
        pusher.set_desired(key, DesiredConfig("v1", "{}", "token"))
    pusher.sync_pods(f"ns/{ONE}", [_pod("one-pod", PREFIX, None)])
    pusher.sync_pods(f"ns/{TWO}", [_pod("two-pod", PREFIX, None)])
    assert pusher.pods["ns/one-pod"].model_deployment == f"ns/{ONE}"
    assert pusher.pods["ns/two-pod"].model_deployment == f"ns/{TWO}"
    assert pusher.model_deployment_of("ns", naming.label_value(ONE)) == f"ns/{ONE}"
    assert pusher.model_deployment_of("ns", naming.label_value(TWO)) == f"ns/{TWO}"
    await pusher.close()


def test_an_object_another_model_deployment_controls_is_not_taken_over() -> None:
    def owned(name: str, uid: str) -> dict[str, Any]:
        ref = {"kind": "ModelDeployment", "name": name, "uid": uid, "controller": True}
        return {"kind": "Deployment", "metadata": {"name": "a-b-c", "ownerReferences": [ref]}}

    desired = owned("a-b", "uid-2")
    with pytest.raises(ControlledElsewhereError, match="ModelDeployment a "):
        check_controller(desired, owned("a", "uid-1"))
    check_controller(desired, owned("a-b", "uid-2"))
    check_controller(desired, owned("a-b", "uid-old"))  # an earlier a-b's, not yet collected
    check_controller(desired, {"kind": "Deployment", "metadata": {"name": "a-b-c"}})


def test_a_kept_selector_degrades_without_making_the_model_deployment_unready() -> None:
    outcome = _RegionOutcome(pool="p", deployment="d", replicas=1, ready=1)
    notice = Problem(LEGACY_SELECTOR, "Deployment d keeps its selector", blocks_ready=False)
    ready, _, degraded = _condition_updates({"p": outcome}, [notice])
    assert (ready.status, degraded.status, degraded.reason) == (True, True, LEGACY_SELECTOR)
    failed = Problem("ApplyFailed", "Service d: 500")
    ready, _, degraded = _condition_updates({"p": outcome}, [notice, failed])
    assert (ready.status, ready.reason, degraded.reason) == (False, "ApplyFailed", "ApplyFailed")
    assert degraded.message == "Service d: 500; Deployment d keeps its selector"
