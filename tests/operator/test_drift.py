"""Drift detection tolerates what the API server adds and catches what someone else changed."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fleetwarden.operator.drift import drifted_paths, merge_patch_for, parse_quantity


def _deployment() -> dict[str, Any]:
    return {
        "metadata": {"name": "d", "labels": {"a": "1"}},
        "spec": {
            "replicas": 2,
            "template": {
                "spec": {
                    "nodeSelector": {"pool": "x"},
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm",
                            "resources": {"limits": {"cpu": "0.5", "memory": "1Gi"}},
                        }
                    ],
                }
            },
        },
    }


def test_server_defaults_and_normalised_quantities_are_not_drift() -> None:
    desired = _deployment()
    live = _deployment()
    live["metadata"]["resourceVersion"] = "7"
    live["metadata"]["labels"]["added-by-someone"] = "x"
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["imagePullPolicy"] = "IfNotPresent"
    container["resources"]["limits"] = {"cpu": "500m", "memory": "1024Mi"}
    live["status"] = {"readyReplicas": 1}
    assert drifted_paths(desired, live) == []


def test_changed_replicas_image_and_extra_node_selector_are_drift() -> None:
    desired = _deployment()
    live = _deployment()
    live["spec"]["replicas"] = 5
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "other"
    live["spec"]["template"]["spec"]["nodeSelector"]["sneaky"] = "1"
    assert sorted(drifted_paths(desired, live)) == [
        ".spec.replicas",
        ".spec.template.spec.containers[0].image",
        ".spec.template.spec.nodeSelector.sneaky",
    ]


def test_merge_patch_removes_keys_from_owned_maps_only() -> None:
    desired = _deployment()
    live = _deployment()
    live["spec"]["template"]["spec"]["nodeSelector"]["old"] = "1"
    live["metadata"]["labels"]["theirs"] = "1"
    patch = merge_patch_for(desired, live)
    assert patch["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "x", "old": None}
    assert "theirs" not in patch["metadata"]["labels"]


def test_empty_desired_values_match_absent_live_values() -> None:
    assert drifted_paths({"spec": {"tolerations": [], "nodeSelector": {}}}, {"spec": {}}) == []


@given(st.integers(0, 10**6), st.sampled_from(["", "m", "Ki", "Mi", "Gi", "k", "M", "G"]))
def test_quantity_round_trips(number: int, suffix: str) -> None:
    value = parse_quantity(f"{number}{suffix}")
    assert value is not None
    assert value >= 0


def test_quantity_equivalences() -> None:
    assert parse_quantity("0.5") == parse_quantity("500m")
    assert parse_quantity("1Gi") == parse_quantity("1024Mi")
    assert parse_quantity("1G") != parse_quantity("1Gi")
    assert parse_quantity("lots") is None
