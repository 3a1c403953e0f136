"""Instances that are still loading count as capacity on scale-out, not on scale-in.

Without this, a model load of minutes against a 15 s cooldown adds an instance every cooldown
until the first one is ready, so one burst runs a region to `max_instances` and the next quiet
minute takes them all away again: the simulator's reactive baseline did exactly that (1,667
launches in a day, half its GPU-hours spent loading). Kubernetes' HPA treats not-ready pods as 0%
on scale-up for the same reason.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetwarden.api.enums import ScalingStrategy
from fleetwarden.scaling import DecisionReason, ScalingSignal, SignalError, make_scaler
from tests.scaling.helpers import CONFIG, T0, signal

R = DecisionReason
UTILISING = [ScalingStrategy.REACTIVE, ScalingStrategy.LT_U, ScalingStrategy.LT_UA]


@pytest.mark.parametrize("strategy", UTILISING)
def test_a_loading_instance_absorbs_a_burst(strategy: ScalingStrategy) -> None:
    """4 ready at 90% + 1 loading = 72% effective: still out; + 2 loading = 60%: hold."""
    scaler = make_scaler(strategy, CONFIG)
    out = scaler.evaluate(signal(current=5, target=7, utilisation=0.9, starting=1))
    assert (out.step, out.reason) == (1, R.UTILISATION_HIGH)
    held = scaler.evaluate(signal(current=6, target=7, utilisation=0.9, starting=2))
    assert (held.step, held.reason) == (0, R.IN_BAND)
    assert scaler.evaluate(signal(current=6, target=7, utilisation=0.9)).step == 1


@pytest.mark.parametrize("strategy", UTILISING)
def test_scale_in_reads_the_ready_instances_only(strategy: ScalingStrategy) -> None:
    """Ready instances at 40% with half the region loading must not look idle (20%)."""
    scaler = make_scaler(strategy, CONFIG)
    decision = scaler.evaluate(signal(current=6, target=3, utilisation=0.4, starting=3))
    assert (decision.step, decision.reason) == (0, R.IN_BAND)
    low = scaler.evaluate(signal(current=6, target=3, utilisation=0.2, starting=3))
    assert (low.step, low.reason) == (-1, R.UTILISATION_LOW)


def test_everything_loading_holds_reactive() -> None:
    """No ready instance serves anything yet: the shells report full (1.0), which now holds."""
    scaler = make_scaler(ScalingStrategy.REACTIVE, CONFIG)
    decision = scaler.evaluate(signal(current=3, utilisation=1.0, starting=3))
    assert (decision.step, decision.reason) == (0, R.IN_BAND)


@pytest.mark.parametrize("starting", [-1, 6])
def test_starting_outside_zero_to_current_is_refused(starting: int) -> None:
    with pytest.raises(SignalError, match="starting"):
        ScalingSignal(now_s=T0, current=5, target=5, utilisation=0.5, starting=starting)


@given(
    strategy=st.sampled_from(list(ScalingStrategy)),
    current=st.integers(2, 10),
    starting_share=st.floats(0.0, 1.0),
    utilisation=st.floats(0.0, 1.5),
    target=st.integers(0, 12),
)
def test_starting_instances_never_make_a_scaler_add_more(
    strategy: ScalingStrategy, current: int, starting_share: float, utilisation: float, target: int
) -> None:
    """Whatever the strategy, knowing that some instances are still loading can only turn a +1
    into a hold, never a hold or a -1 into a +1, and it never changes a hold or a -1 (a hold's
    reason may differ: "in band" instead of "at target")."""
    starting = int(starting_share * current)
    plain = make_scaler(strategy, CONFIG).evaluate(
        signal(current=current, target=target, utilisation=utilisation)
    )
    aware = make_scaler(strategy, CONFIG).evaluate(
        signal(current=current, target=target, utilisation=utilisation, starting=starting)
    )
    assert aware.step <= plain.step
    if plain.step <= 0:
        assert aware.step == plain.step
