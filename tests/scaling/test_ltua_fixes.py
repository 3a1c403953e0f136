"""The pure scalers: a region at 0 instances leaves 0 toward its target without a reading (when
the shell says it cannot observe demand at 0, as the operator does); a reading moves a region at
most once; LT-UA's last window never exceeds the plan's period.

Found by review (/tmp/review-scaling r11, r05, r04): with `minInstances: 0` every strategy held
at 0 forever, since nothing can report utilisation from no instance; one pre-outage reading
walked a region 8 -> 1 one cooldown at a time; a plan period shorter than `lastWindowMinutes`
could not be described at all (`ScalingConfigError`).
"""

from __future__ import annotations

import math

import pytest

from fleetwarden.api.enums import ScalingStrategy
from fleetwarden.api.v1alpha1.modeldeployment import ScalingSettings
from fleetwarden.scaling import DecisionReason, ScalingConfig, SignalError, make_scaler
from tests.scaling.helpers import T0, signal

R = DecisionReason
ZERO_MIN = ScalingConfig(min_instances=0, max_instances=10)


def leaves_zero(max_instances: int = 10) -> ScalingConfig:
    """A config as the operator builds its scalers: it cannot observe demand at 0 instances."""
    return ScalingConfig(
        min_instances=0, max_instances=max_instances, leave_zero_toward_target=True
    )


@pytest.mark.parametrize("strategy", list(ScalingStrategy))
def test_zero_instances_step_toward_a_target_above_zero_without_a_reading(
    strategy: ScalingStrategy,
) -> None:
    scaler = make_scaler(strategy, leaves_zero())
    first = scaler.decide(signal(minute=0, current=0, target=4, utilisation=None))
    assert (first.step, first.reason) == (1, R.TOWARD_TARGET)
    # the cooldown still holds (15 s), then the next step comes, still without a reading
    held = scaler.decide(signal(minute=0.1, current=0, target=4, utilisation=None))
    assert (held.step, held.reason) == (0, R.COOLDOWN)
    again = scaler.decide(signal(minute=0.5, current=0, target=4, utilisation=None))
    assert (again.step, again.reason) == (1, R.TOWARD_TARGET)


@pytest.mark.parametrize("strategy", list(ScalingStrategy))
def test_zero_instances_hold_when_the_target_or_the_maximum_is_zero(
    strategy: ScalingStrategy,
) -> None:
    no_target = make_scaler(strategy, leaves_zero()).decide(
        signal(current=0, target=0, utilisation=None)
    )
    assert (no_target.step, no_target.reason) == (0, R.MISSING_UTILISATION)
    capped = make_scaler(strategy, leaves_zero(0)).decide(
        signal(current=0, target=4, utilisation=None)
    )
    assert (capped.step, capped.reason) == (0, R.MISSING_UTILISATION)


@pytest.mark.parametrize("strategy", list(ScalingStrategy))
def test_without_the_flag_zero_instances_hold_on_no_data(strategy: ScalingStrategy) -> None:
    """The simulator passes waiting requests at an empty region as utilisation itself; a scaler
    not told to leave 0 keeps "missing data never moves a region"."""
    held = make_scaler(strategy, ZERO_MIN).decide(signal(current=0, target=4, utilisation=None))
    assert (held.step, held.reason) == (0, R.MISSING_UTILISATION)


def test_the_operators_settings_turn_leaving_zero_on() -> None:
    config = ScalingConfig.from_settings(
        ScalingSettings(), min_instances=0, max_instances=4, leave_zero_toward_target=True
    )
    assert config.leave_zero_toward_target
    assert not ScalingConfig.from_settings(
        ScalingSettings(), min_instances=0, max_instances=4
    ).leave_zero_toward_target


def test_one_instance_scales_on_its_readings_again() -> None:
    """The zero guard is only for 0: from 1 instance on, missing utilisation holds as before."""
    scaler = make_scaler(ScalingStrategy.LT_U, leaves_zero())
    held = scaler.decide(signal(current=1, target=4, utilisation=None))
    assert (held.step, held.reason) == (0, R.MISSING_UTILISATION)


@pytest.mark.parametrize(
    "strategy", [ScalingStrategy.REACTIVE, ScalingStrategy.LT_U, ScalingStrategy.LT_UA]
)
def test_a_reading_older_than_the_last_step_does_not_move_the_region_again(
    strategy: ScalingStrategy,
) -> None:
    scaler = make_scaler(strategy, ZERO_MIN)
    reading_s = T0 + 60.0 * 5
    first = scaler.decide(signal(minute=5, current=8, target=1, utilisation=0.1))
    assert (first.step, first.reason) == (-1, R.UTILISATION_LOW)
    # 30 s later, past the cooldown, on the same reading: it predates the step, so it holds
    stale = signal(minute=5.5, current=7, target=1, utilisation=0.1)
    assert scaler.evaluate(stale, observed_s=reading_s).reason is R.COOLDOWN
    decision = scaler.decide(stale, observed_s=reading_s)
    assert (decision.step, decision.reason) == (0, R.COOLDOWN)
    # a reading observed after the step moves it again
    fresh = scaler.decide(stale, observed_s=reading_s + 20.0)
    assert (fresh.step, fresh.reason) == (-1, R.UTILISATION_LOW)


def test_without_an_observation_time_the_reading_is_taken_now() -> None:
    """Callers that read fresh every time (the simulator) keep their behaviour."""
    scaler = make_scaler(ScalingStrategy.REACTIVE, ZERO_MIN)
    assert scaler.decide(signal(minute=5, current=8, utilisation=0.1)).step == -1
    assert scaler.decide(signal(minute=5.5, current=7, utilisation=0.1)).step == -1


@pytest.mark.parametrize("observed", [math.nan, math.inf])
def test_a_non_finite_observation_time_is_refused(observed: float) -> None:
    scaler = make_scaler(ScalingStrategy.REACTIVE, ZERO_MIN)
    with pytest.raises(SignalError, match="observed_s"):
        scaler.decide(signal(current=5, utilisation=0.1), observed_s=observed)


def test_the_last_window_is_clamped_to_a_shorter_plan_period() -> None:
    """A 10-minute plan period with the default 20-minute window: the whole period is the
    window (before: ScalingConfigError, so the operator's scaler could not be built)."""
    config = ScalingConfig.from_settings(
        ScalingSettings(), min_instances=1, max_instances=10, period_s=600.0
    )
    assert config.last_window_s == 600.0
    assert config.in_last_window(T0 + 60.0)
    longer = ScalingConfig.from_settings(
        ScalingSettings(), min_instances=1, max_instances=10, period_s=1800.0
    )
    assert longer.last_window_s == 1200.0
    assert [longer.in_last_window(T0 + 60.0 * m) for m in (9, 10, 29, 30, 40)] == [
        False,
        True,
        True,
        False,
        True,
    ]
