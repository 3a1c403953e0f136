"""The scale-in stabilisation window (`scale_in_stabilisation_s`), example by example.

A -1 from a strategy's rule is held (`SCALE_IN_STABILISING`) until the rule has asked for -1 at
every evaluation for the window; any other answer or missing utilisation restarts it, a cooldown
hold leaves it alone, and scale-out and the bounds guards never wait. Config: SageServe's
defaults with bounds [2, 10], a 60 s window and the 15 s cooldown; times are seconds after T0.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from fleetwarden.api.enums import ScalingStrategy
from fleetwarden.api.v1alpha1.modeldeployment import ScalingSettings
from fleetwarden.scaling import (
    DecisionReason,
    Scaler,
    ScalingConfig,
    ScalingConfigError,
    ScalingSignal,
    make_scaler,
)
from tests.scaling.helpers import CONFIG, T0

R = DecisionReason
Facts = dict[str, float | int | None]
S = ScalingStrategy
WINDOW = 60.0
WINDOWED = replace(CONFIG, scale_in_stabilisation_s=WINDOW)

# Per strategy: facts under which its rule asks for -1, and the reason it removes with. LT-UA's
# case is its past-the-target rule: minute 45 of the hour (in the last 20 minutes), at target,
# utilisation low and observed load at 0.1 x forecast.
SCALE_IN: dict[ScalingStrategy, tuple[Facts, DecisionReason]] = {
    S.REACTIVE: ({"current": 6, "target": 6, "utilisation": 0.1}, R.UTILISATION_LOW),
    S.LT_I: ({"current": 7, "target": 3, "utilisation": 0.5}, R.TOWARD_TARGET),
    S.LT_U: ({"current": 7, "target": 3, "utilisation": 0.1}, R.UTILISATION_LOW),
    S.LT_UA: (
        {"current": 6, "target": 6, "utilisation": 0.1, "observed": 10.0, "forecast": 100.0},
        R.LOAD_BELOW_FORECAST,
    ),
}


def at(seconds: float, **facts: float | int | None) -> ScalingSignal:
    """A signal `seconds` after T0, minute 45 of the hour (inside LT-UA's last window)."""
    values: Facts = {"current": 6, "target": 6, "utilisation": 0.5}
    values.update(facts)
    return ScalingSignal(
        now_s=T0 + 45 * 60.0 + seconds,
        current=int(values["current"]),  # type: ignore[arg-type]
        target=int(values["target"]),  # type: ignore[arg-type]
        utilisation=values["utilisation"],
        observed_load_tps=values.get("observed"),
        forecast_load_tps=values.get("forecast"),
    )


def run(scaler: Scaler, ticks: list[tuple[float, Facts]]) -> list[tuple[int, R]]:
    out = []
    for seconds, facts in ticks:
        decision = scaler.decide(at(seconds, **facts))
        out.append((decision.step, decision.reason))
    return out


HELD = (0, R.SCALE_IN_STABILISING)


@pytest.mark.parametrize("strategy", list(S))
def test_each_strategy_removes_only_after_the_window(strategy: ScalingStrategy) -> None:
    low, reason = SCALE_IN[strategy]
    scaler = make_scaler(strategy, WINDOWED)
    got = run(scaler, [(t, low) for t in (0.0, 15.0, 30.0, 45.0, 59.0, 60.0)])
    assert got == [HELD] * 5 + [(-1, reason)]
    assert scaler.scale_in_since_s == T0 + 45 * 60.0
    # without the window the same facts remove at once: the rule does ask for -1 here
    assert run(make_scaler(strategy, CONFIG), [(0.0, low)]) == [(-1, reason)]


@pytest.mark.parametrize("strategy", list(S))
def test_a_removal_does_not_restart_the_window(strategy: ScalingStrategy) -> None:
    """Once the rule has asked for the whole window, removals follow one cooldown apart while
    it keeps asking, as with HPA (a ramp-down is not slowed to one instance per window)."""
    low, reason = SCALE_IN[strategy]
    scaler = make_scaler(strategy, WINDOWED)
    got = run(scaler, [(t, low) for t in (0.0, 30.0, 60.0, 70.0, 75.0, 90.0)])
    assert got == [HELD, HELD, (-1, reason), (0, R.COOLDOWN), (-1, reason), (-1, reason)]


@pytest.mark.parametrize("strategy", list(S))
@pytest.mark.parametrize(
    "interruption",
    [
        {"utilisation": 0.5, "current": 6, "target": 6},  # in band / at target
        {"utilisation": None},  # missing utilisation
        {"utilisation": math.nan},
        {"utilisation": 0.9, "current": 6, "target": 9},  # a scale-out
    ],
    ids=["other-answer", "missing", "nan", "scale-out"],
)
def test_any_other_evaluation_restarts_the_window(
    strategy: ScalingStrategy, interruption: Facts
) -> None:
    low, reason = SCALE_IN[strategy]
    scaler = make_scaler(strategy, WINDOWED)
    got = run(scaler, [(0.0, low), (50.0, low), (55.0, interruption)])
    assert got[:2] == [HELD, HELD]
    assert got[2][1] is not R.SCALE_IN_STABILISING
    assert got[2][0] >= 0
    assert scaler.scale_in_since_s is None
    # after a scale-out at 55 the cooldown runs to 70; the run restarts at the next ask
    start = 70.0 if got[2][0] else 60.0
    got = run(scaler, [(start, low), (start + WINDOW - 1, low), (start + WINDOW, low)])
    assert got == [HELD, HELD, (-1, reason)]


def test_cooldown_holds_neither_extend_nor_restart_the_run() -> None:
    low, reason = SCALE_IN[S.REACTIVE]
    band: Facts = {"utilisation": 0.5}
    # a scale-out at T0+45min-5s: the cooldown runs to +10 s; evaluations before say nothing
    scaler = make_scaler(S.REACTIVE, WINDOWED, last_event_s=at(-5.0).now_s)
    assert run(scaler, [(0.0, low), (5.0, band)]) == [(0, R.COOLDOWN)] * 2
    assert scaler.scale_in_since_s is None  # the rule was not consulted: no run started
    assert run(scaler, [(10.0, low), (69.0, low), (70.0, low)]) == [HELD, HELD, (-1, reason)]
    # in the cooldown after that removal an in-band signal is not looked at either
    assert run(scaler, [(80.0, band), (85.0, low)]) == [(0, R.COOLDOWN), (-1, reason)]
    assert scaler.scale_in_since_s == at(10.0).now_s


def test_at_min_is_reported_before_the_window_and_still_counts_as_asking() -> None:
    scaler = make_scaler(S.REACTIVE, WINDOWED)
    at_min: Facts = {"current": 2, "target": 2, "utilisation": 0.1}
    assert run(scaler, [(0.0, at_min)]) == [(0, R.AT_MIN)]  # the bound, not the window, holds
    assert scaler.scale_in_since_s == at(0.0).now_s


def test_bounds_guards_never_wait() -> None:
    scaler = make_scaler(S.REACTIVE, replace(CONFIG, scale_in_stabilisation_s=3600.0))
    assert run(scaler, [(0.0, {"current": 12, "utilisation": 0.1})]) == [(-1, R.ABOVE_MAX)]
    assert scaler.scale_in_since_s is None  # a bounds guard is not the rule asking
    assert run(scaler, [(15.0, {"current": 1, "utilisation": 0.1})]) == [(1, R.BELOW_MIN)]


@pytest.mark.parametrize("strategy", list(S))
def test_scale_out_is_never_delayed(strategy: ScalingStrategy) -> None:
    """A long run of scale-in asks does not hold back an add, which also ends the run."""
    low, _ = SCALE_IN[strategy]
    up: Facts = {
        "current": 5,
        "target": 8,
        "utilisation": 0.95,
        "observed": 500.0,
        "forecast": 100.0,
    }
    scaler = make_scaler(strategy, replace(CONFIG, scale_in_stabilisation_s=3600.0))
    got = run(scaler, [(15.0 * k, low) for k in range(10)] + [(150.0, up)])
    assert got[:10] == [HELD] * 10
    assert got[10][0] == 1
    assert scaler.scale_in_since_s is None


def test_a_clock_that_runs_backwards_restarts_the_run() -> None:
    low, reason = SCALE_IN[S.REACTIVE]
    scaler = make_scaler(S.REACTIVE, WINDOWED)
    got = run(scaler, [(100.0, low), (40.0, low), (100.0, low), (160.0, low), (220.0, low)])
    # at 40 the run restarts (it does not keep its start at 100), so 100 is its 60th second
    assert got == [HELD, HELD, (-1, reason), (-1, reason), (-1, reason)]
    assert scaler.scale_in_since_s == at(40.0).now_s


def test_a_rebuilt_scaler_starts_a_new_run() -> None:
    """A shell rebuilds scalers on spec changes, carrying only the cooldown (`last_event_s`)."""
    low, reason = SCALE_IN[S.REACTIVE]
    old = make_scaler(S.REACTIVE, WINDOWED)
    run(old, [(0.0, low), (45.0, low)])
    new = make_scaler(S.REACTIVE, WINDOWED, last_event_s=old.last_event_s)
    assert new.scale_in_since_s is None
    assert run(new, [(60.0, low), (119.0, low), (120.0, low)]) == [HELD, HELD, (-1, reason)]


@pytest.mark.parametrize("strategy", list(S))
def test_evaluate_has_no_side_effects(strategy: ScalingStrategy) -> None:
    low, reason = SCALE_IN[strategy]
    peeker = make_scaler(strategy, WINDOWED)
    # only dry runs: no run ever starts, so every one of them is held
    assert [peeker.evaluate(at(t, **low)).reason for t in (0.0, 60.0, 600.0)] == [
        R.SCALE_IN_STABILISING
    ] * 3
    assert (peeker.scale_in_since_s, peeker.last_event_s) == (None, None)
    # interleaved with decisions, dry runs answer what decide answers and change nothing
    plain = make_scaler(strategy, WINDOWED)
    for t in (0.0, 20.0, 40.0, 60.0, 75.0):
        sig = at(t, **low)
        before = (peeker.scale_in_since_s, peeker.last_event_s)
        peeked = peeker.evaluate(sig)
        assert peeker.evaluate(sig) == peeked
        assert (peeker.scale_in_since_s, peeker.last_event_s) == before
        assert peeker.decide(sig) == peeked == plain.decide(sig)
    assert (peeked.step, peeked.reason) == (-1, reason)
    assert peeker.last_event_s == plain.last_event_s == at(75.0).now_s


# --- config and CRD settings ---------------------------------------------------------------


def test_the_default_is_no_window() -> None:
    assert CONFIG.scale_in_stabilisation_s == 0.0
    assert ScalingSettings().scale_in_stabilization_seconds == 0
    low, reason = SCALE_IN[S.REACTIVE]
    assert run(make_scaler(S.REACTIVE, CONFIG), [(0.0, low)]) == [(-1, reason)]


@pytest.mark.parametrize("value", [-1.0, -1e-9, math.nan, math.inf, -math.inf])
def test_config_rejects_a_negative_or_non_finite_window(value: float) -> None:
    with pytest.raises(ScalingConfigError, match="scale_in_stabilisation_s"):
        ScalingConfig(max_instances=4, scale_in_stabilisation_s=value)


def test_from_settings_reads_the_spec_field() -> None:
    settings = ScalingSettings.model_validate({"scaleInStabilizationSeconds": 300})
    config = ScalingConfig.from_settings(settings, min_instances=1, max_instances=4)
    assert config.scale_in_stabilisation_s == 300.0
    default = ScalingConfig.from_settings(ScalingSettings(), min_instances=1, max_instances=4)
    assert default.scale_in_stabilisation_s == 0.0
