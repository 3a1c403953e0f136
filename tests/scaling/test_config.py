"""ScalingConfig validation, its mapping from the CRD, and the end-of-period window."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fleetwarden.api.v1alpha1.modeldeployment import ScalingSettings
from fleetwarden.scaling import (
    Decision,
    DecisionReason,
    ScalingConfig,
    ScalingConfigError,
    ScalingSignal,
    SignalError,
)
from tests.scaling.helpers import T0


def test_defaults_are_sageserves() -> None:
    config = ScalingConfig(max_instances=3)
    assert (config.scale_out_utilisation, config.scale_in_utilisation) == (0.70, 0.30)
    assert config.cooldown_s == 15.0
    assert (config.period_s, config.last_window_s) == (3600.0, 1200.0)
    assert (config.up_factor, config.down_factor) == (5.0, 0.5)


@pytest.mark.parametrize(
    "overrides",
    [
        {"min_instances": 4, "max_instances": 3},
        {"min_instances": -1},
        {"scale_out_utilisation": 0.3, "scale_in_utilisation": 0.3},  # up <= down
        {"scale_out_utilisation": 0.2, "scale_in_utilisation": 0.5},
        {"scale_out_utilisation": 1.5},
        {"scale_in_utilisation": -0.1},
        {"scale_out_utilisation": math.nan},  # NaN would slip past every comparison
        {"cooldown_s": 0.0},
        {"cooldown_s": math.inf},
        {"period_s": 0.0},
        {"last_window_s": 3601.0},
        {"last_window_s": -1.0},
        {"up_factor": 1.0},
        {"down_factor": 1.0},
        {"down_factor": 0.0},
        {"period_offset_s": math.nan},
    ],
    ids=repr,
)
def test_nonsense_is_a_typed_error(overrides: dict[str, Any]) -> None:
    kwargs: dict[str, Any] = {"max_instances": 3, **overrides}
    with pytest.raises(ScalingConfigError):
        ScalingConfig(**kwargs)


def test_config_error_is_a_value_error() -> None:
    """Shells that already catch ValueError for bad specs keep working."""
    assert issubclass(ScalingConfigError, ValueError)


def test_from_settings_maps_the_crd_fields() -> None:
    settings = ScalingSettings.model_validate(
        {
            "scaleOutUtilization": 0.8,
            "scaleInUtilization": 0.2,
            "cooldownSeconds": 30,
            "lastWindowMinutes": 10,
            "upFactor": 4.0,
            "downFactor": 0.25,
        }
    )
    config = ScalingConfig.from_settings(settings, min_instances=1, max_instances=7)
    assert config == ScalingConfig(
        max_instances=7,
        min_instances=1,
        scale_out_utilisation=0.8,
        scale_in_utilisation=0.2,
        cooldown_s=30.0,
        last_window_s=600.0,
        up_factor=4.0,
        down_factor=0.25,
    )


def test_from_default_settings_equals_defaults() -> None:
    config = ScalingConfig.from_settings(ScalingSettings(), min_instances=0, max_instances=3)
    assert config == ScalingConfig(max_instances=3)


@pytest.mark.parametrize(
    ("seconds_into_hour", "inside"),
    [
        (0.0, False),
        (2399.0, False),
        (2399.999, False),
        (2400.0, True),  # minute 40: the last 20 minutes begin
        (3000.0, True),
        (3599.999, True),
        (3600.0, False),  # the next hour: its own plan, its own window later
    ],
)
def test_last_window_is_the_last_20_minutes_half_open(
    seconds_into_hour: float, inside: bool
) -> None:
    config = ScalingConfig(max_instances=3)
    assert config.in_last_window(T0 + seconds_into_hour) is inside


def test_period_offset_moves_the_window() -> None:
    """Plans made at :30 have their window from :10 to :30."""
    config = ScalingConfig(max_instances=3, period_offset_s=1800.0)
    assert not config.in_last_window(T0 + 0.0)
    assert config.in_last_window(T0 + 600.0)
    assert config.in_last_window(T0 + 1799.0)
    assert not config.in_last_window(T0 + 1800.0)


def test_zero_window_never_opens() -> None:
    config = ScalingConfig(max_instances=3, last_window_s=0.0)
    assert not any(config.in_last_window(T0 + s) for s in range(0, 3600, 30))


def test_clamp() -> None:
    config = ScalingConfig(min_instances=2, max_instances=5)
    assert [config.clamp(n) for n in (0, 2, 4, 5, 9)] == [2, 2, 4, 5, 5]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"now_s": math.nan, "current": 1, "target": 1},
        {"now_s": 0.0, "current": -1, "target": 1},
        {"now_s": 0.0, "current": 1, "target": -1},
    ],
)
def test_signal_rejects_impossible_facts(kwargs: dict[str, Any]) -> None:
    with pytest.raises(SignalError):
        ScalingSignal(utilisation=0.5, **kwargs)


@pytest.mark.parametrize("utilisation", [None, math.nan, math.inf, -math.inf, -0.01])
def test_unusable_utilisation(utilisation: float | None) -> None:
    sig = ScalingSignal(now_s=0.0, current=1, target=1, utilisation=utilisation)
    assert sig.usable_utilisation is None


@pytest.mark.parametrize(
    ("observed", "forecast", "ratio"),
    [
        (100.0, 20.0, 5.0),
        (0.0, 20.0, 0.0),
        (None, 20.0, None),
        (100.0, None, None),
        (100.0, 0.0, None),  # a plan for no load says nothing about the forecast's error
        (math.nan, 20.0, None),
        (100.0, math.inf, None),
        (-5.0, 20.0, None),
    ],
)
def test_load_ratio(observed: float | None, forecast: float | None, ratio: float | None) -> None:
    sig = ScalingSignal(
        now_s=0.0,
        current=1,
        target=1,
        utilisation=0.5,
        observed_load_tps=observed,
        forecast_load_tps=forecast,
    )
    assert sig.load_ratio == ratio


@pytest.mark.parametrize("step", [-2, 2, 5])
def test_decision_steps_are_unit(step: int) -> None:
    with pytest.raises(ValueError, match="step"):
        Decision(step, DecisionReason.IN_BAND)
