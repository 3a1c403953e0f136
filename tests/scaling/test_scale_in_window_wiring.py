"""The operator's scaling memory (`Autoscaler`) applies `spec.scaling.scaleInStabilizationSeconds`:
the field goes through `ScalingConfig.from_settings` into the scalers it keeps across reconciles,
and a spec change that rebuilds the scaler starts the window afresh (it carries only the
cooldown)."""

from __future__ import annotations

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec
from fleetwarden.operator.autoscaler import Autoscaler, RegionSignal
from fleetwarden.scaling import DecisionReason

R = DecisionReason
KEY = "ns/m"
T0 = 1_800_000_000.0


def _spec(window_s: int | None) -> ModelDeploymentSpec:
    scaling: dict[str, object] = {"strategy": "reactive", "cooldownSeconds": 15}
    if window_s is not None:
        scaling["scaleInStabilizationSeconds"] = window_s
    return ModelDeploymentSpec.model_validate(
        {
            "model": {"name": "m"},
            "throughput": {"A100-80GB": 1000},
            "regions": [{"pool": "p", "minInstances": 1, "maxInstances": 8}],
            "scaling": scaling,
        }
    )


def _step(autoscaler: Autoscaler, spec: ModelDeploymentSpec, now_s: float) -> tuple[int, R]:
    autoscaler.signals[KEY, "p"] = RegionSignal(observed_s=now_s, utilisation=0.1, load_tps=None)
    step = autoscaler.step(KEY, spec, spec.regions[0], current=5, now_s=now_s)
    assert step is not None
    return step.after - step.before, step.decision.reason


def test_the_operator_holds_scale_in_for_the_window() -> None:
    autoscaler, spec = Autoscaler(), _spec(60)
    got = [_step(autoscaler, spec, T0 + t) for t in (0.0, 15.0, 30.0, 59.0, 60.0, 75.0)]
    held = (0, R.SCALE_IN_STABILISING)
    low = (-1, R.UTILISATION_LOW)
    assert got == [held, held, held, held, low, low]


def test_without_the_field_the_operator_removes_at_once() -> None:
    for spec in (_spec(None), _spec(0)):
        assert _step(Autoscaler(), spec, T0) == (-1, R.UTILISATION_LOW)


def test_a_spec_change_restarts_the_window_but_keeps_the_cooldown() -> None:
    autoscaler = Autoscaler()
    assert _step(autoscaler, _spec(0), T0) == (-1, R.UTILISATION_LOW)
    # the new spec rebuilds the scaler: the cooldown from T0 carries over, the window starts anew
    assert _step(autoscaler, _spec(60), T0 + 5.0) == (0, R.COOLDOWN)
    assert _step(autoscaler, _spec(60), T0 + 15.0) == (0, R.SCALE_IN_STABILISING)
    assert _step(autoscaler, _spec(60), T0 + 74.0) == (0, R.SCALE_IN_STABILISING)
    assert _step(autoscaler, _spec(60), T0 + 75.0) == (-1, R.UTILISATION_LOW)


def test_a_stale_signal_restarts_the_window() -> None:
    """A Prometheus gap (no fresh reading: the replicas hold) breaks the run of -1 answers, so
    the first reading after it does not remove an instance on evidence from before the gap."""
    autoscaler, spec = Autoscaler(), _spec(60)
    assert _step(autoscaler, spec, T0) == (0, R.SCALE_IN_STABILISING)
    assert _step(autoscaler, spec, T0 + 45.0) == (0, R.SCALE_IN_STABILISING)
    stale_at = T0 + 50.0 + autoscaler.max_signal_age_s + 1.0
    assert autoscaler.step(KEY, spec, spec.regions[0], current=5, now_s=stale_at) is None
    after = stale_at + 15.0
    assert _step(autoscaler, spec, after) == (0, R.SCALE_IN_STABILISING)
    assert _step(autoscaler, spec, after + 59.0) == (0, R.SCALE_IN_STABILISING)
    assert _step(autoscaler, spec, after + 60.0) == (-1, R.UTILISATION_LOW)
