"""Properties every strategy keeps, over random configs and random signal sequences.

- Bounds: a region that starts inside [min, max] never leaves it, whatever the signals (LT-UA is
  the interesting case: it is the only strategy that passes its target).
- Cooldown: no two non-zero decisions of one scaler are closer than `cooldown_s`, even when the
  shell's clock jumps backwards.
- Agreement with the reactive baseline (the precise form of "reactive and LT strategies agree when
  target equals current"): with target == current, inside the bounds and from the same cooldown
  state,
    (a) no LT strategy moves where reactive holds, and none moves against it: each LT step is 0
        or reactive's step (LT-U and LT-UA keep this for any target, being utilisation-gated);
    (b) LT-I and LT-U always hold, and so does LT-UA outside its last window;
    (c) inside the last window, when the observed/forecast ratio confirms reactive's direction
        (>= up_factor when reactive adds, <= down_factor when it removes), LT-UA's decision
        equals reactive's.
  So at target LT-UA is reactive gated by traffic evidence, and the other LT strategies are
  reactive with both directions capped.
- Determinism: the same signal sequence gives the same decisions from fresh scalers, and
  `evaluate` changes nothing.
- Missing utilisation never moves anything.
"""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.api.enums import ScalingStrategy
from fleetwarden.scaling import (
    DecisionReason,
    ScalingConfig,
    ScalingSignal,
    make_scaler,
)
from tests.scaling.helpers import T0

PROPS = settings(max_examples=100, deadline=None)
LT = (ScalingStrategy.LT_I, ScalingStrategy.LT_U, ScalingStrategy.LT_UA)


@st.composite
def configs(draw: st.DrawFn) -> ScalingConfig:
    low = draw(st.integers(0, 4))
    high = draw(st.integers(low, low + 8))
    scale_in = draw(st.floats(0.0, 0.9))
    scale_out = draw(st.floats(scale_in, 1.0).filter(lambda x: x > scale_in))
    period = float(draw(st.integers(60, 3600)))
    return ScalingConfig(
        min_instances=low,
        max_instances=high,
        scale_in_utilisation=scale_in,
        scale_out_utilisation=scale_out,
        cooldown_s=draw(st.floats(0.5, 60.0)),
        period_s=period,
        period_offset_s=draw(st.floats(0.0, period)),
        last_window_s=draw(st.floats(0.0, period)),
        up_factor=draw(st.floats(1.01, 10.0)),
        down_factor=draw(st.floats(0.01, 0.99)),
    )


utilisations = st.one_of(
    st.none(),
    st.just(math.nan),
    st.floats(-0.2, 1.3),
    st.sampled_from([0.0, 0.3, 0.7, 1.0]),
)
loads = st.one_of(st.none(), st.floats(0.0, 1e4), st.just(0.0))
strategies_ = st.sampled_from(list(ScalingStrategy))


@st.composite
def facts(draw: st.DrawFn) -> tuple[int, float | None, float | None, float | None]:
    """(target, utilisation, observed load, forecast load) of one tick."""
    return (
        draw(st.integers(0, 15)),
        draw(utilisations),
        draw(loads),
        draw(loads),
    )


@given(
    config=configs(),
    strategy=strategies_,
    start=st.integers(0, 20),
    ticks=st.lists(st.tuples(st.floats(0.0, 40.0), facts()), max_size=40),
)
@PROPS
def test_replicas_never_leave_the_bounds(
    config: ScalingConfig,
    strategy: ScalingStrategy,
    start: int,
    ticks: list[tuple[float, tuple[int, float | None, float | None, float | None]]],
) -> None:
    scaler = make_scaler(strategy, config)
    current, now = config.clamp(start), T0
    for gap, (target, utilisation, observed, forecast) in ticks:
        now += gap
        decision = scaler.decide(
            ScalingSignal(now, current, target, utilisation, observed, forecast)
        )
        current += decision.step
        assert config.min_instances <= current <= config.max_instances, (decision, current)


@given(config=configs(), strategy=strategies_, current=st.integers(0, 20), tick=facts())
@PROPS
def test_out_of_bounds_only_steps_toward_the_bounds(
    config: ScalingConfig,
    strategy: ScalingStrategy,
    current: int,
    tick: tuple[int, float | None, float | None, float | None],
) -> None:
    target, utilisation, observed, forecast = tick
    step = (
        make_scaler(strategy, config)
        .decide(ScalingSignal(T0, current, target, utilisation, observed, forecast))
        .step
    )
    if current < config.min_instances:
        assert step in (0, 1)
    elif current > config.max_instances:
        assert step in (-1, 0)


@given(
    config=configs(),
    strategy=strategies_,
    start=st.integers(0, 20),
    # jumps may be negative: a shell's clock can be corrected backwards
    ticks=st.lists(st.tuples(st.floats(-30.0, 40.0), facts()), max_size=40),
)
@PROPS
def test_cooldown_always_holds(
    config: ScalingConfig,
    strategy: ScalingStrategy,
    start: int,
    ticks: list[tuple[float, tuple[int, float | None, float | None, float | None]]],
) -> None:
    scaler = make_scaler(strategy, config)
    current, now, events = config.clamp(start), T0, []
    for gap, (target, utilisation, observed, forecast) in ticks:
        now += gap
        decision = scaler.decide(
            ScalingSignal(now, current, target, utilisation, observed, forecast)
        )
        if decision.step:
            events.append(now)
            current += decision.step
    for earlier, later in itertools.combinations(events, 2):
        assert abs(later - earlier) >= config.cooldown_s


@given(
    config=configs(),
    current=st.integers(0, 12),
    utilisation=utilisations,
    observed=loads,
    forecast=loads,
    now=st.floats(T0, T0 + 7200.0),
    last_event=st.one_of(st.none(), st.floats(T0 - 100.0, T0 + 7200.0)),
)
@PROPS
def test_lt_strategies_agree_with_reactive_at_target(
    config: ScalingConfig,
    current: int,
    utilisation: float | None,
    observed: float | None,
    forecast: float | None,
    now: float,
    last_event: float | None,
) -> None:
    current = config.clamp(current)
    sig = ScalingSignal(now, current, current, utilisation, observed, forecast)

    def step(strategy: ScalingStrategy) -> int:
        return make_scaler(strategy, config, last_event_s=last_event).decide(sig).step

    reactive = step(ScalingStrategy.REACTIVE)
    lt = {s: step(s) for s in LT}
    # (a) never where reactive holds, never against it
    assert all(v in (0, reactive) for v in lt.values()), (reactive, lt)
    # (b) LT-I and LT-U hold at target; LT-UA too outside its window
    assert lt[ScalingStrategy.LT_I] == 0
    assert lt[ScalingStrategy.LT_U] == 0
    if not config.in_last_window(now):
        assert lt[ScalingStrategy.LT_UA] == 0
    # (c) inside the window, with traffic confirming reactive's direction, LT-UA is reactive
    ratio = sig.load_ratio
    confirmed = ratio is not None and (
        (reactive > 0 and ratio >= config.up_factor)
        or (reactive < 0 and ratio <= config.down_factor)
    )
    if config.in_last_window(now) and confirmed:
        assert lt[ScalingStrategy.LT_UA] == reactive


@given(
    config=configs(),
    current=st.integers(0, 12),
    target=st.integers(0, 15),
    utilisation=utilisations,
    observed=loads,
    forecast=loads,
    now=st.floats(T0, T0 + 7200.0),
)
@PROPS
def test_deferred_strategies_never_move_against_reactive(
    config: ScalingConfig,
    current: int,
    target: int,
    utilisation: float | None,
    observed: float | None,
    forecast: float | None,
    now: float,
) -> None:
    """LT-U and LT-UA are utilisation-gated for any target, not only at target."""
    sig = ScalingSignal(now, current, target, utilisation, observed, forecast)
    reactive = make_scaler(ScalingStrategy.REACTIVE, config).decide(sig).step
    for strategy in (ScalingStrategy.LT_U, ScalingStrategy.LT_UA):
        assert make_scaler(strategy, config).decide(sig).step in (0, reactive)


@given(
    config=configs(),
    strategy=st.sampled_from(LT),
    current=st.integers(0, 12),
    target=st.integers(0, 15),
    utilisation=utilisations,
    observed=loads,
    forecast=loads,
    now=st.floats(T0, T0 + 7200.0),
)
@PROPS
def test_lt_steps_close_the_gap_to_the_target(
    config: ScalingConfig,
    strategy: ScalingStrategy,
    current: int,
    target: int,
    utilisation: float | None,
    observed: float | None,
    forecast: float | None,
    now: float,
) -> None:
    """Inside the bounds, LT-I and LT-U only ever move toward the (clamped) target; LT-UA may pass
    it only in its window and only with a forecast-gap reason."""
    current = config.clamp(current)
    sig = ScalingSignal(now, current, target, utilisation, observed, forecast)
    decision = make_scaler(strategy, config).decide(sig)
    goal = config.clamp(target)
    if decision.step == 0:
        return
    if abs(current + decision.step - goal) < abs(current - goal):
        return
    assert strategy is ScalingStrategy.LT_UA
    assert config.in_last_window(now)
    assert decision.reason in (
        DecisionReason.LOAD_ABOVE_FORECAST,
        DecisionReason.LOAD_BELOW_FORECAST,
    )


@given(
    config=configs(),
    strategy=strategies_,
    ticks=st.lists(
        st.tuples(st.floats(-5.0, 40.0), st.integers(0, 15), facts()),
        max_size=40,
    ),
)
@PROPS
def test_strategies_are_deterministic(
    config: ScalingConfig,
    strategy: ScalingStrategy,
    ticks: list[tuple[float, int, tuple[int, float | None, float | None, float | None]]],
) -> None:
    first, second = make_scaler(strategy, config), make_scaler(strategy, config)
    now = T0
    for gap, current, (target, utilisation, observed, forecast) in ticks:
        now += gap
        sig = ScalingSignal(now, current, target, utilisation, observed, forecast)
        peeked = first.evaluate(sig)
        assert first.evaluate(sig) == peeked  # evaluate changes nothing
        assert first.decide(sig) == peeked == second.decide(sig)
        assert first.last_event_s == second.last_event_s


@given(
    config=configs(),
    strategy=strategies_,
    current=st.integers(0, 20),
    target=st.integers(0, 20),
    utilisation=st.one_of(st.none(), st.just(math.nan), st.floats(max_value=-1e-9)),
    now=st.floats(T0, T0 + 7200.0),
)
@PROPS
def test_missing_utilisation_never_moves(
    config: ScalingConfig,
    strategy: ScalingStrategy,
    current: int,
    target: int,
    utilisation: float | None,
    now: float,
) -> None:
    decision = make_scaler(strategy, config).decide(
        ScalingSignal(now, current, target, utilisation, 1e6, 1.0)
    )
    assert (decision.step, decision.reason) == (0, DecisionReason.MISSING_UTILISATION)
