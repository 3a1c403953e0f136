"""The rule of docs/scaling.md for starting instances, on the signal's own terms (review r07).

`utilisation` is the mean over the instances that report one, the ready ones (sidecars export no
KV series while their engine loads). Scale-out reads the ready instances' usage spread over ready
plus starting instances, once; scale-in reads the ready instances' own mean. These pin that rule;
the sidecar tests (`tests/sidecar/test_kv_gauge_lifecycle*.py`) show that the live input now is
that mean, which it was not while loading pods exported 0.0.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetwarden.scaling import DecisionReason, ReactiveScaler, ScalingConfig, ScalingSignal

CONFIG = ScalingConfig(min_instances=1, max_instances=10)


@given(
    ready=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8),
    starting=st.integers(0, 8),
)
def test_scale_out_spreads_the_ready_usage_over_every_instance_and_scale_in_reads_it_as_is(
    ready: list[float], starting: int
) -> None:
    current = len(ready) + starting
    mean = sum(ready) / len(ready)
    signal = ScalingSignal(0.0, current, current, utilisation=mean, starting=starting)
    # Scale-out: as if each starting instance were an idle one, counted once (HPA's rule).
    assert signal.scale_out_utilisation == pytest.approx(sum(ready) / current)
    # Scale-in: the ready instances' own mean, whatever is loading.
    assert signal.usable_utilisation == mean


@pytest.mark.parametrize(
    ("ready", "starting", "step", "reason"),
    [
        ([0.95, 0.95, 0.95], 1, 1, DecisionReason.UTILISATION_HIGH),  # 0.7125 > 0.70
        ([0.95, 0.95, 0.95], 2, 0, DecisionReason.IN_BAND),  # 0.57: the loading ones absorb it
        ([0.50], 1, 0, DecisionReason.IN_BAND),  # scale-in reads 0.50, not 0.25
        ([0.20], 3, -1, DecisionReason.UTILISATION_LOW),  # the ready one is idle indeed
    ],
)
def test_the_reviewed_regions(
    ready: list[float], starting: int, step: int, reason: DecisionReason
) -> None:
    current = len(ready) + starting
    mean = sum(ready) / len(ready)
    decision = ReactiveScaler(CONFIG).decide(
        ScalingSignal(0.0, current, current, utilisation=mean, starting=starting)
    )
    assert (decision.step, decision.reason) == (step, reason)
