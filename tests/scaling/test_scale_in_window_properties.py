"""The scale-in stabilisation window as properties over random configs and signal sequences.

- Window 0 is the old behaviour exactly: a window-0 scaler decides, step and reason, what a
  reference copy of the strategies as they were before the window (`_reference`, below) decides,
  over random sequences with clocks that may jump backwards.
- Any window only ever turns a rule's -1 into a `SCALE_IN_STABILISING` hold: every other decision
  (scale-out, the bounds guards, cooldown, missing data, in-band holds) is what a window-0 scaler
  in the same cooldown state answers.
- It holds exactly as long as documented: a rule's -1 goes through iff the rule has asked for -1
  at every evaluation that consulted it for at least the window (an oracle over the history).
- The window can only delay or drop removals, never add one (follows from the second property).
- `evaluate` changes nothing: dry runs sprinkled anywhere leave the decisions unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.api.enums import ScalingStrategy
from fleetwarden.scaling import Decision, DecisionReason, ScalingConfig, ScalingSignal, make_scaler
from tests.scaling.helpers import T0

PROPS = settings(max_examples=100, deadline=None)
R = DecisionReason
S = ScalingStrategy


# --- the strategies as they were before the window (reference copy) --------------------------


@dataclass
class _Reference:
    """SageServe's four rules and the shared guards, without any scale-in window."""

    strategy: ScalingStrategy
    config: ScalingConfig
    last_event_s: float | None = None

    def decide(self, sig: ScalingSignal) -> Decision:
        decision = self.evaluate(sig)
        if decision.step:
            self.last_event_s = sig.now_s
        return decision

    def evaluate(self, sig: ScalingSignal) -> Decision:
        c = self.config
        u = sig.usable_utilisation
        if u is None:
            return Decision(0, R.MISSING_UTILISATION)
        if self.last_event_s is not None and sig.now_s - self.last_event_s < c.cooldown_s:
            return Decision(0, R.COOLDOWN)
        if sig.current < c.min_instances:
            return Decision(1, R.BELOW_MIN)
        if sig.current > c.max_instances:
            return Decision(-1, R.ABOVE_MAX)
        out = sig.scale_out_utilisation
        assert out is not None
        decision = self._rule(sig, out, u, c.clamp(sig.target))
        if decision.step > 0 and sig.current >= c.max_instances:
            return Decision(0, R.AT_MAX)
        if decision.step < 0 and sig.current <= c.min_instances:
            return Decision(0, R.AT_MIN)
        return decision

    def _rule(self, sig: ScalingSignal, out: float, u: float, target: int) -> Decision:
        c, cur = self.config, sig.current
        high, low = out > c.scale_out_utilisation, u < c.scale_in_utilisation
        if self.strategy is S.REACTIVE:
            if high:
                return Decision(1, R.UTILISATION_HIGH)
            return Decision(-1, R.UTILISATION_LOW) if low else Decision(0, R.IN_BAND)
        if self.strategy is S.LT_I:
            if cur != target:
                return Decision(1 if cur < target else -1, R.TOWARD_TARGET)
            return Decision(0, R.AT_TARGET)
        if not (high or low):
            return Decision(0, R.IN_BAND)
        direction = 1 if high else -1
        if (high and cur < target) or (low and cur > target):
            return Decision(direction, R.UTILISATION_HIGH if high else R.UTILISATION_LOW)
        ratio = sig.load_ratio
        if self.strategy is S.LT_U or not c.in_last_window(sig.now_s) or ratio is None:
            return Decision(0, R.AT_TARGET)
        if high and ratio >= c.up_factor:
            return Decision(1, R.LOAD_ABOVE_FORECAST)
        if low and ratio <= c.down_factor:
            return Decision(-1, R.LOAD_BELOW_FORECAST)
        return Decision(0, R.AT_TARGET)


# --- random inputs ------------------------------------------------------------------------------


@st.composite
def configs(draw: st.DrawFn) -> ScalingConfig:
    low = draw(st.integers(0, 3))
    scale_in = draw(st.sampled_from([0.0, 0.2, 0.3, 0.5]))
    period = float(draw(st.sampled_from([600, 3600])))
    return ScalingConfig(
        min_instances=low,
        max_instances=draw(st.integers(low, low + 6)),
        scale_in_utilisation=scale_in,
        scale_out_utilisation=draw(st.sampled_from([0.6, 0.7, 0.9, 1.0])),
        cooldown_s=draw(st.sampled_from([0.5, 15.0, 30.0])),
        period_s=period,
        last_window_s=draw(st.sampled_from([0.0, period / 3, period])),
        up_factor=draw(st.sampled_from([1.5, 5.0])),
        down_factor=draw(st.sampled_from([0.5, 0.9])),
    )


# utilisation is often low so that runs of scale-in asks are long enough to reach the windows
utilisations = st.one_of(
    st.sampled_from([0.0, 0.05, 0.1, 0.1, 0.5, 0.95, None, math.nan]),
    st.floats(-0.1, 1.2),
)
loads = st.one_of(st.none(), st.sampled_from([0.0, 10.0, 50.0, 100.0, 500.0, 1000.0]))


@st.composite
def signals(draw: st.DrawFn, now: float) -> ScalingSignal:
    current = draw(st.integers(0, 10))
    return ScalingSignal(
        now_s=now,
        current=current,
        target=draw(st.integers(0, 10)),
        utilisation=draw(utilisations),
        observed_load_tps=draw(loads),
        forecast_load_tps=draw(loads),
        starting=draw(st.integers(0, current)),
    )


@st.composite
def sequences(draw: st.DrawFn) -> list[ScalingSignal]:
    """Up to 60 signals; gaps around the cooldowns and windows, sometimes negative (a shell's
    clock set back). A signal often repeats the previous one's facts, so runs of scale-in asks
    are long enough to reach the windows."""
    now, out = T0, list[ScalingSignal]()
    for _ in range(draw(st.integers(0, 60))):
        now += draw(st.one_of(st.sampled_from([0.0, 5.0, 15.0, 30.0]), st.floats(-40.0, 120.0)))
        if draw(st.booleans()) and out:
            out.append(replace(out[-1], now_s=now))
        else:
            out.append(draw(signals(now)))
    return out


windows = st.one_of(st.sampled_from([0.0, 15.0, 30.0, 60.0, 300.0]), st.floats(0.0, 400.0))


def _asked_in(reference: Decision) -> bool | None:
    """Whether the rule asked for -1, read off the old decision (None: cooldown, not asked).
    `AT_MIN` is only ever a rule's -1 held at the bound; `ABOVE_MAX` is the bounds guard's."""
    if reference.reason is R.COOLDOWN:
        return None
    return reference.reason is R.AT_MIN or (
        reference.step < 0 and reference.reason is not R.ABOVE_MAX
    )


# --- properties ---------------------------------------------------------------------------------


@given(config=configs(), strategy=st.sampled_from(list(S)), seq=sequences())
@PROPS
def test_window_zero_decides_exactly_as_before(
    config: ScalingConfig, strategy: ScalingStrategy, seq: list[ScalingSignal]
) -> None:
    scaler = make_scaler(strategy, config)  # the default: no window
    explicit = make_scaler(strategy, replace(config, scale_in_stabilisation_s=0.0))
    reference = _Reference(strategy, config)
    for sig in seq:
        expected = reference.decide(sig)
        assert scaler.decide(sig) == expected
        assert explicit.decide(sig) == expected
        assert scaler.last_event_s == reference.last_event_s


@given(config=configs(), strategy=st.sampled_from(list(S)), window=windows, seq=sequences())
@PROPS
def test_the_window_only_ever_holds_a_rules_scale_in(
    config: ScalingConfig, strategy: ScalingStrategy, window: float, seq: list[ScalingSignal]
) -> None:
    """Scale-out, the bounds guards and every hold are untouched; a rule's -1 is either kept or
    held as `SCALE_IN_STABILISING`, and never held once the window has passed."""
    scaler = make_scaler(strategy, replace(config, scale_in_stabilisation_s=window))
    for sig in seq:
        unwindowed = _Reference(strategy, config, scaler.last_event_s).evaluate(sig)
        decision = scaler.decide(sig)
        if decision.reason is R.SCALE_IN_STABILISING:
            assert decision.step == 0
            assert unwindowed.step == -1
            assert unwindowed.reason is not R.ABOVE_MAX
            assert window > 0
        else:
            assert decision == unwindowed


@given(config=configs(), strategy=st.sampled_from(list(S)), window=windows, seq=sequences())
@PROPS
def test_a_scale_in_goes_through_iff_the_rule_asked_for_the_whole_window(
    config: ScalingConfig, strategy: ScalingStrategy, window: float, seq: list[ScalingSignal]
) -> None:
    """The oracle keeps the history of the rule's answers (cooldown holds left out: they do not
    consult it); the run is the unbroken suffix of asks, and it started at the earliest of their
    times (a clock set back before the run's start restarts it there)."""
    scaler = make_scaler(strategy, replace(config, scale_in_stabilisation_s=window))
    history: list[tuple[float, bool]] = []  # (time, asked for -1) of evaluations past cooldown
    for sig in seq:
        unwindowed = _Reference(strategy, config, scaler.last_event_s).evaluate(sig)
        asked = _asked_in(unwindowed)
        if asked is not None:
            history.append((sig.now_s, asked))
        run: list[float] = []
        for t, asked_then in reversed(history):
            if not asked_then:
                break
            run.append(t)
        start = min(run, default=None)
        decision = scaler.decide(sig)
        assert scaler.scale_in_since_s == start
        if unwindowed.step == -1 and unwindowed.reason is not R.ABOVE_MAX:
            assert start is not None
            expected = -1 if sig.now_s - start >= window else 0
            assert decision.step == expected, (sig.now_s - start, window, decision)


@given(
    config=configs(),
    strategy=st.sampled_from(list(S)),
    window=windows,
    seq=sequences(),
    peeks=st.lists(st.booleans(), min_size=60, max_size=60),
)
@PROPS
def test_evaluate_changes_nothing(
    config: ScalingConfig,
    strategy: ScalingStrategy,
    window: float,
    seq: list[ScalingSignal],
    peeks: list[bool],
) -> None:
    windowed = replace(config, scale_in_stabilisation_s=window)
    peeked, plain = make_scaler(strategy, windowed), make_scaler(strategy, windowed)
    for sig, peek in zip(seq, peeks, strict=False):
        if peek:
            state = (peeked.scale_in_since_s, peeked.last_event_s)
            dry = peeked.evaluate(sig)
            # a dry run at another time (even far ahead) changes nothing either
            peeked.evaluate(replace(sig, now_s=sig.now_s + 10 * window + 100.0))
            assert (peeked.scale_in_since_s, peeked.last_event_s) == state
            assert peeked.decide(sig) == dry == plain.decide(sig)
        else:
            assert peeked.decide(sig) == plain.decide(sig)
        assert peeked.scale_in_since_s == plain.scale_in_since_s
        assert peeked.last_event_s == plain.last_event_s
