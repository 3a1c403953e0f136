"""The pydantic models and the CRD rules agree on every input, not just on the examples."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from fleetwarden.api.crds import all_crds
from fleetwarden.api.v1alpha1 import (
    LabelSelector,
    ModelDeploymentSpec,
    RegionPoolSpec,
    TenantPolicySpec,
)
from tests.support.crd_admission import AdmissionError, CrdAdmission, verdicts

ADMISSION = CrdAdmission(all_crds().values())


def _model_deployment(**spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": "m"},
        "throughput": {"A100-80GB": 1000},
        "regions": [{"pool": "p", "maxInstances": 4}],
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": "fleetwarden.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "x", "namespace": "n"},
        "spec": spec,
    }


def _verdicts(obj: dict[str, Any]) -> tuple[bool, bool]:
    return verdicts(ADMISSION, ModelDeploymentSpec, obj)


@settings(max_examples=150, deadline=None)
@given(low=st.integers(0, 20), high=st.integers(1, 20))
def test_min_max_instances_same_verdict(low: int, high: int) -> None:
    obj = _model_deployment(regions=[{"pool": "p", "minInstances": low, "maxInstances": high}])
    crd_ok, model_ok = _verdicts(obj)
    assert crd_ok == model_ok == (low <= high)


@settings(max_examples=150, deadline=None)
@given(
    scale_in=st.floats(0, 0.99, allow_nan=False),
    scale_out=st.floats(0.01, 1, allow_nan=False),
)
def test_scaling_thresholds_same_verdict(scale_in: float, scale_out: float) -> None:
    obj = _model_deployment(
        scaling={"scaleInUtilization": scale_in, "scaleOutUtilization": scale_out}
    )
    crd_ok, model_ok = _verdicts(obj)
    assert crd_ok == model_ok == (scale_in < scale_out)


@settings(max_examples=150, deadline=None)
@given(first=st.floats(0, 1, allow_nan=False), second=st.floats(0, 1, allow_nan=False))
def test_release_thresholds_same_verdict(first: float, second: float) -> None:
    obj = _model_deployment(niw={"releaseAt": [first, second]})
    crd_ok, model_ok = _verdicts(obj)
    assert crd_ok == model_ok == (first > second)


@settings(max_examples=100, deadline=None)
@given(
    gpus=st.one_of(st.none(), st.integers(-2, 5)),
    instances=st.one_of(st.none(), st.integers(-2, 5)),
)
def test_pool_capacity_same_verdict(gpus: int | None, instances: int | None) -> None:
    capacity = {k: v for k, v in (("gpus", gpus), ("instances", instances)) if v is not None}
    spec = {"region": "r", "gpuType": "A100", "capacity": capacity, "costPerHour": 1}
    obj = {
        "apiVersion": "fleetwarden.dev/v1alpha1",
        "kind": "RegionPool",
        "metadata": {"name": "p"},
        "spec": spec,
    }
    try:
        ADMISSION.admit(obj)
        crd_ok = True
    except AdmissionError:
        crd_ok = False
    try:
        RegionPoolSpec.model_validate(spec)
        model_ok = True
    except ValidationError:
        model_ok = False
    expected = bool(capacity) and all(v >= 1 for v in capacity.values())
    assert crd_ok == model_ok == expected


@pytest.mark.parametrize(
    ("selector", "labels", "selected"),
    [
        ({}, {"a": "1"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]},
            {"a": "2"},
            True,
        ),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        (
            {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]},
            {"a": "1"},
            False,
        ),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"b": "1"}, True),
    ],
)
def test_label_selector_semantics_match_kubernetes(
    selector: dict[str, Any], labels: dict[str, str], selected: bool
) -> None:
    assert LabelSelector.model_validate(selector).matches(labels) is selected


@pytest.mark.parametrize(
    ("pull_secrets", "admitted"),
    [
        (None, True),
        ([], True),
        ([{"name": "regcred"}, {"name": "mirror.example-pull"}], True),
        ([{"name": "Not_A_Secret_Name"}], False),
        ([{}], False),
        (["regcred"], False),  # the core/v1 shape, as in a pod spec: a list of {name}
        ([{"name": "regcred", "namespace": "other"}], False),  # only this namespace's Secrets
    ],
)
def test_image_pull_secrets_same_verdict(pull_secrets: Any, admitted: bool) -> None:
    obj = _model_deployment(imagePullSecrets=pull_secrets)
    crd_ok, model_ok = _verdicts(obj)
    assert crd_ok == model_ok == admitted


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize(
    "where",
    [
        ("ModelDeployment", "throughput"),
        ("ModelDeployment", "startupCost"),
        ("RegionPool", "costPerHour"),
        ("RegionPool", "spot.costPerHour"),
    ],
)
def test_planner_numbers_must_be_finite(where: tuple[str, str], value: float) -> None:
    """YAML reads `.inf` and `.nan` as floats, and no CRD schema rule can refuse them; an
    infinite throughput or cost made the planner serve nothing or find no plan, silently. The
    model refuses them (the operator reports InvalidSpec), and finite values still pass."""
    kind, field = where
    if kind == "ModelDeployment":
        spec = _model_deployment()["spec"]
        model: type[ModelDeploymentSpec | RegionPoolSpec] = ModelDeploymentSpec
    else:
        spec = {"region": "r", "gpuType": "A100", "capacity": {"gpus": 8}, "costPerHour": 1.0}
        model = RegionPoolSpec
    model.model_validate(spec)
    if field == "throughput":
        spec["throughput"] = {"A100-80GB": value}
    elif field == "spot.costPerHour":
        spec["spot"] = {"enabled": True, "costPerHour": value}
    else:
        spec[field] = value
    with pytest.raises(ValidationError, match="finite"):
        model.model_validate(spec)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize(
    "where",
    [
        ("TenantPolicy", ("tokenWeights", "input")),
        ("TenantPolicy", ("tokenWeights", "system")),
        ("TenantPolicy", ("tokenWeights", "output")),
        ("TenantPolicy", ("dpa", "severelyExpiredSeconds")),
        ("TenantPolicy", ("dpa", "urgentWithinSeconds")),
        ("ModelDeployment", ("scaling", "upFactor")),
    ],
)
def test_unbounded_numbers_must_be_finite(where: tuple[str, tuple[str, str]], value: float) -> None:
    """The floats with no upper bound: an infinite token weight would reach the sidecars' config
    as JSON `Infinity` (not JSON), an infinite upFactor would switch LT-UA's upward pass off
    without saying so. Bounded floats already refuse infinity through their bound."""
    kind, (section, field) = where
    if kind == "ModelDeployment":
        spec = _model_deployment()["spec"]
        model: type[ModelDeploymentSpec | TenantPolicySpec] = ModelDeploymentSpec
    else:
        spec = {"selector": {}}
        model = TenantPolicySpec
    model.model_validate(spec)
    spec[section] = {field: value}
    with pytest.raises(ValidationError, match="finite"):
        model.model_validate(spec)
    spec[section] = {field: 3.0}
    model.model_validate(spec)
