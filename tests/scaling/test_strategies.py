"""Example tests: each rule of each strategy, the shared guards, and LT-UA's last 20 minutes.

The config is SageServe's (0.70 / 0.30, 15 s cooldown, last 20 minutes, 5x / 0.5x) with bounds
[2, 10]; signals are built by minute of an hour (see helpers).
"""

from __future__ import annotations

import math

import pytest

from fleetwarden.api.enums import ScalingStrategy
from fleetwarden.scaling import (
    SCALERS,
    DecisionReason,
    DeferredArimaGapScaler,
    DeferredUtilisationScaler,
    ImmediateScaler,
    ReactiveScaler,
    ScalingConfig,
    make_scaler,
)
from tests.scaling.helpers import CONFIG, T0, signal

R = DecisionReason
ALL = list(ScalingStrategy)


def _one(strategy: ScalingStrategy, **kwargs: object) -> tuple[int, DecisionReason]:
    decision = make_scaler(strategy, CONFIG).decide(signal(**kwargs))  # type: ignore[arg-type]
    return decision.step, decision.reason


def test_factory_covers_every_crd_strategy() -> None:
    assert set(SCALERS) == set(ScalingStrategy)
    assert isinstance(make_scaler(ScalingStrategy.LT_UA, CONFIG), DeferredArimaGapScaler)
    assert all(make_scaler(s, CONFIG).strategy is s for s in ScalingStrategy)


# --- reactive ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("utilisation", "expected"),
    [
        (0.71, (1, R.UTILISATION_HIGH)),
        (0.70, (0, R.IN_BAND)),  # "above 0.70": the threshold itself holds
        (0.50, (0, R.IN_BAND)),
        (0.30, (0, R.IN_BAND)),
        (0.29, (-1, R.UTILISATION_LOW)),
        (0.0, (-1, R.UTILISATION_LOW)),
        (1.3, (1, R.UTILISATION_HIGH)),  # over 1 only says "full"
    ],
)
def test_reactive_follows_utilisation(utilisation: float, expected: tuple[int, R]) -> None:
    assert _one(ScalingStrategy.REACTIVE, utilisation=utilisation) == expected


def test_reactive_ignores_the_plan() -> None:
    assert _one(ScalingStrategy.REACTIVE, current=5, target=9, utilisation=0.1) == (
        -1,
        R.UTILISATION_LOW,
    )
    assert _one(ScalingStrategy.REACTIVE, current=5, target=2, utilisation=0.9) == (
        1,
        R.UTILISATION_HIGH,
    )


# --- LT-I -------------------------------------------------------------------------------------


@pytest.mark.parametrize("utilisation", [0.0, 0.5, 0.95])
def test_lt_i_walks_to_the_target_whatever_the_utilisation(utilisation: float) -> None:
    assert _one(ScalingStrategy.LT_I, current=3, target=7, utilisation=utilisation) == (
        1,
        R.TOWARD_TARGET,
    )
    assert _one(ScalingStrategy.LT_I, current=7, target=3, utilisation=utilisation) == (
        -1,
        R.TOWARD_TARGET,
    )
    assert _one(ScalingStrategy.LT_I, current=5, target=5, utilisation=utilisation) == (
        0,
        R.AT_TARGET,
    )


def test_lt_i_reaches_a_new_target_one_step_per_cooldown() -> None:
    """A plan at the hour asking 3 -> 8 is met 4 cooldowns after the first step."""
    scaler = ImmediateScaler(CONFIG)
    current, times = 3, []
    for tick in range(40):
        now = T0 + 5.0 * tick  # the shell ticks faster than the cooldown
        decision = scaler.decide(signal(minute=(now - T0) / 60, current=current, target=8))
        if decision.step:
            times.append(now - T0)
            current += decision.step
    assert current == 8
    assert times == [0.0, 15.0, 30.0, 45.0, 60.0]


def test_lt_i_target_outside_bounds_is_clamped() -> None:
    assert _one(ScalingStrategy.LT_I, current=10, target=50) == (0, R.AT_TARGET)
    assert _one(ScalingStrategy.LT_I, current=2, target=0) == (0, R.AT_TARGET)


# --- LT-U -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "target", "utilisation", "expected"),
    [
        (4, 7, 0.8, (1, R.UTILISATION_HIGH)),  # below target, utilisation rising: go
        (4, 7, 0.5, (0, R.IN_BAND)),  # below target but no pressure yet: defer
        (4, 7, 0.1, (0, R.AT_TARGET)),  # low, but the plan wants more, not fewer
        (7, 7, 0.95, (0, R.AT_TARGET)),  # target reached: LT-U stops
        (7, 4, 0.1, (-1, R.UTILISATION_LOW)),
        (7, 4, 0.5, (0, R.IN_BAND)),
        (7, 4, 0.9, (0, R.AT_TARGET)),  # high, but the plan wants fewer
        (4, 4, 0.1, (0, R.AT_TARGET)),
    ],
)
def test_lt_u_moves_toward_target_only_on_a_threshold(
    current: int, target: int, utilisation: float, expected: tuple[int, R]
) -> None:
    assert (
        _one(ScalingStrategy.LT_U, current=current, target=target, utilisation=utilisation)
        == expected
    )


def test_lt_u_ignores_the_forecast_gap_even_in_the_last_window() -> None:
    got = _one(
        ScalingStrategy.LT_U,
        minute=50,
        current=7,
        target=7,
        utilisation=0.95,
        observed=1000.0,
        forecast=10.0,
    )
    assert got == (0, R.AT_TARGET)


# --- LT-UA ------------------------------------------------------------------------------------


def test_lt_ua_is_lt_u_before_the_target() -> None:
    for utilisation, current, target in [(0.8, 4, 7), (0.1, 7, 4), (0.5, 4, 7)]:
        for minute in (5.0, 50.0):
            kwargs = {"minute": minute, "current": current, "target": target}
            assert _one(ScalingStrategy.LT_UA, utilisation=utilisation, **kwargs) == _one(
                ScalingStrategy.LT_U, utilisation=utilisation, **kwargs
            )


@pytest.mark.parametrize(
    ("minute", "observed", "expected"),
    [
        (39.99, 500.0, (0, R.AT_TARGET)),  # before the window: the target holds
        (40.0, 500.0, (1, R.LOAD_ABOVE_FORECAST)),  # 5x exactly: ">= 5x"
        (59.99, 10_000.0, (1, R.LOAD_ABOVE_FORECAST)),
        (60.0, 500.0, (0, R.AT_TARGET)),  # next hour, minute 0: outside again
        (50.0, 499.0, (0, R.AT_TARGET)),  # 4.99x is not enough
        (50.0, None, (0, R.AT_TARGET)),  # no observed load: no evidence against the forecast
    ],
)
def test_lt_ua_passes_the_target_up_in_the_last_20_minutes(
    minute: float, observed: float | None, expected: tuple[int, R]
) -> None:
    got = _one(
        ScalingStrategy.LT_UA,
        minute=minute,
        current=6,
        target=6,
        utilisation=0.9,
        observed=observed,
        forecast=100.0,
    )
    assert got == expected


@pytest.mark.parametrize(
    ("minute", "observed", "utilisation", "expected"),
    [
        (45.0, 50.0, 0.1, (-1, R.LOAD_BELOW_FORECAST)),  # 0.5x exactly: "<= 0.5x"
        (45.0, 0.0, 0.1, (-1, R.LOAD_BELOW_FORECAST)),
        (45.0, 51.0, 0.1, (0, R.AT_TARGET)),
        (30.0, 10.0, 0.1, (0, R.AT_TARGET)),  # not in the window yet
        (45.0, 10.0, 0.5, (0, R.IN_BAND)),  # the utilisation gate still applies past target
    ],
)
def test_lt_ua_passes_the_target_down_in_the_last_20_minutes(
    minute: float, observed: float, utilisation: float, expected: tuple[int, R]
) -> None:
    got = _one(
        ScalingStrategy.LT_UA,
        minute=minute,
        current=6,
        target=6,
        utilisation=utilisation,
        observed=observed,
        forecast=100.0,
    )
    assert got == expected


def test_lt_ua_burst_needs_utilisation_too() -> None:
    """A 10x burst with idle KV cache (e.g. tiny requests) adds nothing: the gate is kept."""
    got = _one(
        ScalingStrategy.LT_UA,
        minute=50,
        current=6,
        target=6,
        utilisation=0.5,
        observed=1000.0,
        forecast=100.0,
    )
    assert got == (0, R.IN_BAND)


def test_lt_ua_zero_forecast_does_not_run_away() -> None:
    got = _one(
        ScalingStrategy.LT_UA,
        minute=50,
        current=6,
        target=6,
        utilisation=0.9,
        observed=1000.0,
        forecast=0.0,
    )
    assert got == (0, R.AT_TARGET)


def test_lt_ua_burst_climbs_to_max_and_stops() -> None:
    """From minute 40 a 6x burst with full KV cache walks from the target to max, one per 15 s."""
    scaler = DeferredArimaGapScaler(CONFIG)
    current, steps = 6, []
    for tick in range(0, 120):
        minute = 40.0 + tick * 5.0 / 60
        decision = scaler.decide(
            signal(
                minute=minute,
                current=current,
                target=6,
                utilisation=0.95,
                observed=600.0,
                forecast=100.0,
            )
        )
        current += decision.step
        steps.append(decision.reason)
    assert current == CONFIG.max_instances
    assert steps.count(R.LOAD_ABOVE_FORECAST) == CONFIG.max_instances - 6
    assert steps[-1] is R.AT_MAX


def test_lt_ua_window_follows_the_period_offset() -> None:
    config = ScalingConfig(min_instances=2, max_instances=10, period_offset_s=1800.0)
    scaler = DeferredArimaGapScaler(config)
    # minute 50 of a wall-clock hour is minute 20 of a period starting at :30 -> outside
    sig = signal(minute=50, current=6, target=6, utilisation=0.9, observed=900.0, forecast=100.0)
    assert scaler.decide(sig).reason is R.AT_TARGET
    # minute 15 is minute 45 of that period -> inside
    sig = signal(minute=15, current=6, target=6, utilisation=0.9, observed=900.0, forecast=100.0)
    assert scaler.decide(sig).reason is R.LOAD_ABOVE_FORECAST


# --- shared guards ----------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ALL)
@pytest.mark.parametrize("utilisation", [None, math.nan, -0.5, math.inf])
def test_missing_utilisation_holds(strategy: ScalingStrategy, utilisation: float | None) -> None:
    """Even LT-I (which ignores utilisation) and a region far above target hold: no data, no
    change, above all no scale-down on an empty query."""
    got = _one(strategy, current=9, target=2, utilisation=utilisation, minute=50)
    assert got == (0, R.MISSING_UTILISATION)


@pytest.mark.parametrize("strategy", ALL)
def test_cooldown_holds_then_releases(strategy: ScalingStrategy) -> None:
    scaler = make_scaler(strategy, CONFIG)
    hot = {"current": 5, "target": 8, "utilisation": 0.9}
    assert scaler.decide(signal(minute=10.0, **hot)).step == 1  # type: ignore[arg-type]
    assert scaler.last_event_s == T0 + 600.0
    assert scaler.decide(signal(minute=10.2, current=6, target=8, utilisation=0.9)) == (
        scaler.decide(signal(minute=10.2, current=6, target=8, utilisation=0.9))
    )
    held = scaler.decide(signal(minute=10.0 + 14.9 / 60, current=6, target=8, utilisation=0.9))
    assert (held.step, held.reason) == (0, R.COOLDOWN)
    assert scaler.decide(signal(minute=10.25, current=6, target=8, utilisation=0.9)).step == 1


def test_cooldown_holds_when_the_clock_goes_back() -> None:
    scaler = ReactiveScaler(CONFIG)
    assert scaler.decide(signal(minute=10, utilisation=0.9)).step == 1
    assert scaler.decide(signal(minute=5, utilisation=0.9)).reason is R.COOLDOWN


def test_cooldown_survives_a_rebuild() -> None:
    first = DeferredUtilisationScaler(CONFIG)
    first.decide(signal(minute=10, current=4, target=8, utilisation=0.9))
    rebuilt = DeferredArimaGapScaler(CONFIG, last_event_s=first.last_event_s)
    got = rebuilt.decide(signal(minute=10.1, current=5, target=8, utilisation=0.9))
    assert got.reason is R.COOLDOWN


def test_evaluate_does_not_start_a_cooldown() -> None:
    scaler = ReactiveScaler(CONFIG)
    assert scaler.evaluate(signal(utilisation=0.9)).step == 1
    assert scaler.last_event_s is None
    assert scaler.decide(signal(utilisation=0.9)).step == 1


@pytest.mark.parametrize("strategy", ALL)
def test_bounds_hold_at_max_and_min(strategy: ScalingStrategy) -> None:
    up = _one(strategy, current=10, target=10, utilisation=0.99, observed=1e6, forecast=1.0)
    assert up[0] == 0
    down = _one(strategy, current=2, target=2, utilisation=0.0, observed=0.0, forecast=1.0)
    assert down[0] == 0


def test_reactive_names_the_bound_it_hits() -> None:
    assert _one(ScalingStrategy.REACTIVE, current=10, utilisation=0.99) == (0, R.AT_MAX)
    assert _one(ScalingStrategy.REACTIVE, current=2, utilisation=0.0) == (0, R.AT_MIN)


@pytest.mark.parametrize("strategy", ALL)
def test_out_of_bounds_steps_back_inside(strategy: ScalingStrategy) -> None:
    """Bounds changed under the region (spec edit): every strategy walks back into them, even
    against its own rule (reactive at 0.1 utilisation still adds up to min)."""
    assert _one(strategy, current=1, target=1, utilisation=0.1) == (1, R.BELOW_MIN)
    assert _one(strategy, current=12, target=12, utilisation=0.9) == (-1, R.ABOVE_MAX)
