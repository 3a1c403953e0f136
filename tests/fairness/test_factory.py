"""Every TenantPolicy choice builds the policy it names, configured as the config says."""

from __future__ import annotations

import pytest

from fleetwarden.api.enums import LengthPrediction, PolicyName
from fleetwarden.api.v1alpha1 import ModelDeploymentSpec, TenantPolicySpec
from fleetwarden.fairness.drr import DeficitRoundRobin
from fleetwarden.fairness.factory import build_policy
from fleetwarden.fairness.fcfs import FirstComeFirstServed
from fleetwarden.fairness.prediction import MovingAverage
from fleetwarden.fairness.request import Request
from fleetwarden.fairness.vtc import LeastCounterFirst, VirtualTokenCounter
from fleetwarden.fairness.wsc import WeightedServiceCounter
from fleetwarden.operator.fairness_render import PolicyRef, render_fairness_config

MD = ModelDeploymentSpec.model_validate(
    {
        "model": {"name": "m"},
        "throughput": {"A100": 1000},
        "regions": [{"pool": "p", "maxInstances": 2}],
    }
)


def config(**spec: object) -> object:
    policy = TenantPolicySpec.model_validate(spec)
    return render_fairness_config(MD, PolicyRef("ns", "tp", "t", True, policy))


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("fcfs", FirstComeFirstServed),
        ("lcf", LeastCounterFirst),
        ("vtc", VirtualTokenCounter),
        ("wsc", WeightedServiceCounter),
        ("drr", DeficitRoundRobin),
    ],
)
def test_each_policy_name_builds_its_class(name: str, cls: type) -> None:
    policy = build_policy(config(policy=name))  # type: ignore[arg-type]
    assert type(policy) is cls
    request = Request(0, "acme", 0.0, 10, 10)
    policy.push(request, 0.0)
    assert policy.pop(0.0) is request


def test_vtc_takes_prices_and_weights_from_the_config() -> None:
    policy = build_policy(
        config(  # type: ignore[arg-type]
            policy="vtc",
            tokenWeights={"input": 1, "output": 3},
            tenants=[{"name": "acme", "weight": 2}],
        )
    )
    assert isinstance(policy, VirtualTokenCounter)
    request = Request(0, "acme", 0.0, 100, 10)
    policy.push(request, 0.0)
    policy.pop(0.0)
    policy.charge(request, output_tokens=10, now=1.0)
    assert policy.counters["acme"] == (100 + 3 * 10) / 2


def test_moving_average_prediction_uses_the_shells_predictor() -> None:
    average = MovingAverage(default=40)
    policy = build_policy(
        config(policy="vtc", lengthPrediction=LengthPrediction.MOVING_AVERAGE.value),  # type: ignore[arg-type]
        predictor=average,
    )
    assert isinstance(policy, VirtualTokenCounter)
    policy.push(Request(0, "a", 0.0, 10, 500), 0.0)
    policy.pop(0.0)
    assert policy.counters["a"] == 10 + 2 * 40  # the prediction, not max_tokens, is charged


def test_policy_enum_is_exhaustively_buildable() -> None:
    for name in PolicyName:
        build_policy(config(policy=name.value))  # type: ignore[arg-type]
