"""The four scaling strategies of SageServe section 6.4 as pure state machines.

Each strategy answers one question every cooldown: +1, -1 or 0 instances for one (model, region)
now? The only state is the time of the last scaling event (for the cooldown) and the time since
which the rule has kept asking for -1 (for the scale-in stabilisation window); the clock, the
replica count, the plan's target and the measurements all arrive in a `ScalingSignal`.

`Scaler.decide` applies, in this order, the guards every strategy shares and then the strategy's
own rule:

0. with `leave_zero_toward_target` (the operator's scalers), a region at 0 instances with a
   target above 0 (clamped) -> +1 once the cooldown has passed, whatever the utilisation: with
   no instance nothing can report one, so waiting for it (as the rules below do) would keep a
   region with `min_instances` 0 at 0 for good;
1. missing utilisation -> hold (fail static: never scale, above all never down, on no data);
2. cooldown -> hold until `cooldown_s` has passed since the last non-zero decision, and until a
   reading observed after that decision arrives (`observed_s`): a reading taken before a step
   cannot show its effect, so one reading justifies at most one step;
3. outside [min, max] (the bounds changed under the region) -> one step back inside;
4. the strategy's rule, with the plan's target clamped into [min, max];
5. a step that would leave [min, max] becomes a hold (`AT_MAX`/`AT_MIN`);
6. a -1 from the rule becomes a hold (`SCALE_IN_STABILISING`) until the rule has asked for -1 at
   every evaluation for `scale_in_stabilisation_s` (0 by default: no wait).

Guards 3 and 5 are why no strategy can pass the bounds, whatever its rule says (guard 0 only
fires when the clamped target, hence `max_instances`, is at least 1). Every non-zero
decision starts a cooldown: the shell is expected to apply it (a failed patch still waits the
cooldown, which errs toward doing less).

The stabilisation window (guard 6) is a run: `decide` records when an unbroken run of
evaluations whose rule answered -1 began (an `AT_MIN` hold included: the rule still asked). An
evaluation with missing utilisation, a bounds guard (3) or any other answer of the rule ends the
run; a cooldown hold (a reading older than the last event included) does not consult the rule
and leaves the run as it is, so once the window has passed, removals follow each other one
cooldown apart while the rule keeps asking, as with HPA. A clock set back before the run's
start restarts the run there. Scale-out and the bounds guards never wait. The run lives in the
scaler only: a rebuilt scaler (spec change, restart) starts a new one, since the old one was
measured against the old rule and thresholds (it errs toward doing less).

The rules:

- reactive (SageServe's production baseline): +1 above the scale-out threshold, -1 below the
  scale-in threshold; the plan is ignored (except by guard 0, its operator's way back from 0).
- LT-I (immediate): one step toward the target every cooldown, whatever the utilisation. The
  interface moves one instance at a time, so "jump to the target at the hour" becomes a walk of
  |target - current| steps starting as soon as a new target arrives (20 instances take under
  5 minutes at the 15 s default, less than one model load).
- LT-U (deferred on utilisation): +1 above the scale-out threshold while below target, -1 below
  the scale-in threshold while above target; otherwise hold.
- LT-UA (deferred on utilisation and ARIMA gap): LT-U, and in the last `last_window_s` of the
  period, once the target is reached, keep going past it while utilisation still breaches the
  threshold AND observed load >= up_factor x forecast (up) or <= down_factor x forecast (down).
  Requiring the utilisation breach as well keeps the rule self-limiting: SageServe's text
  ("we defer the scale out or in based on the memory usage thresholds ... however, we do not
  strictly stop ... if the instance count reaches the target") reads as lifting the target's cap,
  not the utilisation gate, and without the gate a 5x burst would add an instance every cooldown
  for 20 minutes long after the extra capacity stopped being used.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import ClassVar

from fleetwarden.api.enums import ScalingStrategy
from fleetwarden.scaling.config import ScalingConfig
from fleetwarden.scaling.signal import Decision, DecisionReason, ScalingSignal, SignalError

HOLD_IN_BAND = Decision(0, DecisionReason.IN_BAND)
HOLD_AT_TARGET = Decision(0, DecisionReason.AT_TARGET)


class Scaler(ABC):
    """Shared guards (missing data, cooldown, bounds, scale-in window) around a strategy's rule."""

    strategy: ClassVar[ScalingStrategy]

    __slots__ = ("_config", "_last_event_s", "_scale_in_since_s")

    def __init__(self, config: ScalingConfig, *, last_event_s: float | None = None) -> None:
        """`last_event_s` carries the cooldown over when a shell rebuilds the scaler, e.g. after a
        spec change or a restart that recovered the last scaling time from status. The scale-in
        stabilisation window always starts afresh."""
        self._config = config
        self._last_event_s = last_event_s
        self._scale_in_since_s: float | None = None

    @property
    def config(self) -> ScalingConfig:
        return self._config

    @property
    def last_event_s(self) -> float | None:
        """Time of the last non-zero decision, or None if there was none yet."""
        return self._last_event_s

    @property
    def scale_in_since_s(self) -> float | None:
        """Start of the unbroken run of evaluations whose rule asked for -1, or None when the
        last evaluation that consulted the rule did not ask (or there was none yet)."""
        return self._scale_in_since_s

    def decide(self, signal: ScalingSignal, *, observed_s: float | None = None) -> Decision:
        """The decision for `signal`; a non-zero one starts the cooldown at `signal.now_s`, and
        the rule's answer extends or ends the scale-in run.

        `observed_s` is when the signal's measurements were taken (None: at `signal.now_s`). A
        shell that keeps readings between polls passes it, so that a reading older than the last
        scaling event holds (`COOLDOWN`) instead of moving the region a second time."""
        decision, asked_in = self._assess(signal, observed_s)
        if asked_in is not None:
            self._scale_in_since_s = self._run_start(signal.now_s) if asked_in else None
        if decision.step:
            self._last_event_s = signal.now_s
        return decision

    def evaluate(self, signal: ScalingSignal, *, observed_s: float | None = None) -> Decision:
        """What `decide` would answer, without starting a cooldown or touching the scale-in run
        (for dry runs and status)."""
        return self._assess(signal, observed_s)[0]

    def _run_start(self, now_s: float) -> float:
        """When the scale-in run started if the rule asks for -1 at `now_s`."""
        since = self._scale_in_since_s
        return now_s if since is None or since > now_s else since

    def _assess(
        self, signal: ScalingSignal, observed_s: float | None
    ) -> tuple[Decision, bool | None]:
        """The decision, and whether the rule asked for -1 (None: the rule was not consulted
        because of the cooldown, which neither extends nor ends the scale-in run)."""
        config = self._config
        if observed_s is not None and not math.isfinite(observed_s):
            raise SignalError(f"observed_s must be finite, got {observed_s}")
        leaving_zero = signal.current == 0 and config.clamp(signal.target) > 0
        if leaving_zero and config.leave_zero_toward_target:
            return self._leave_zero(signal)
        utilisation = signal.usable_utilisation
        if utilisation is None:
            return Decision(0, DecisionReason.MISSING_UTILISATION), False
        observed = signal.now_s if observed_s is None else observed_s
        if self.cooling_down(signal.now_s) or not self.is_new(observed):
            return Decision(0, DecisionReason.COOLDOWN), None
        if signal.current < config.min_instances:
            return Decision(1, DecisionReason.BELOW_MIN), False
        if signal.current > config.max_instances:
            return Decision(-1, DecisionReason.ABOVE_MAX), False
        target = config.clamp(signal.target)
        out_utilisation = signal.scale_out_utilisation
        assert out_utilisation is not None  # None only when `utilisation` is
        decision = self._rule(signal, out_utilisation, utilisation, target)
        if decision.step > 0 and signal.current >= config.max_instances:
            return Decision(0, DecisionReason.AT_MAX), False
        if decision.step >= 0:
            return decision, False
        if signal.current <= config.min_instances:
            return Decision(0, DecisionReason.AT_MIN), True
        asked_for_s = signal.now_s - self._run_start(signal.now_s)
        if asked_for_s < config.scale_in_stabilisation_s:
            return Decision(0, DecisionReason.SCALE_IN_STABILISING), True
        return decision, True

    def _leave_zero(self, signal: ScalingSignal) -> tuple[Decision, bool | None]:
        """Guard 0: +1 from 0 instances toward a target above 0, once the cooldown has passed.

        No reading is needed or read: with no instance there is none. The step is one instance;
        from there the strategy's rule, on that instance's readings, takes over."""
        if self.cooling_down(signal.now_s):
            return Decision(0, DecisionReason.COOLDOWN), None
        if signal.current < self._config.min_instances:
            return Decision(1, DecisionReason.BELOW_MIN), False
        return Decision(1, DecisionReason.TOWARD_TARGET), False

    def is_new(self, observed_s: float) -> bool:
        """Whether a reading observed at `observed_s` postdates the last scaling event, and so
        may justify a step: one taken before (or at) it cannot reflect the step already taken."""
        last = self._last_event_s
        return last is None or observed_s > last

    def cooling_down(self, now_s: float) -> bool:
        """Whether `now_s` is less than `cooldown_s` after the last event.

        A clock that went backwards (now before the last event) also counts as cooling down, so
        two events are never closer than the cooldown in either order of their timestamps.
        """
        last = self._last_event_s
        return last is not None and now_s - last < self._config.cooldown_s

    @abstractmethod
    def _rule(
        self, signal: ScalingSignal, out_utilisation: float, in_utilisation: float, target: int
    ) -> Decision:
        """The strategy's own answer for a region inside its bounds, with `target` clamped.

        Scale-out tests read `out_utilisation` (starting instances counted as empty capacity,
        `ScalingSignal.scale_out_utilisation`), scale-in tests `in_utilisation` (ready ones only).
        """


class ReactiveScaler(Scaler):
    """SageServe's reactive baseline: follow utilisation, ignore the plan."""

    strategy = ScalingStrategy.REACTIVE
    __slots__ = ()

    def _rule(
        self, signal: ScalingSignal, out_utilisation: float, in_utilisation: float, target: int
    ) -> Decision:
        config = self._config
        if out_utilisation > config.scale_out_utilisation:
            return Decision(1, DecisionReason.UTILISATION_HIGH)
        if in_utilisation < config.scale_in_utilisation:
            return Decision(-1, DecisionReason.UTILISATION_LOW)
        return HOLD_IN_BAND


class ImmediateScaler(Scaler):
    """LT-I: walk to the plan's target one step per cooldown, whatever the utilisation."""

    strategy = ScalingStrategy.LT_I
    __slots__ = ()

    def _rule(
        self, signal: ScalingSignal, out_utilisation: float, in_utilisation: float, target: int
    ) -> Decision:
        if signal.current < target:
            return Decision(1, DecisionReason.TOWARD_TARGET)
        if signal.current > target:
            return Decision(-1, DecisionReason.TOWARD_TARGET)
        return HOLD_AT_TARGET


class DeferredUtilisationScaler(Scaler):
    """LT-U: move toward the target only while utilisation breaches a threshold."""

    strategy = ScalingStrategy.LT_U
    __slots__ = ()

    def _rule(
        self, signal: ScalingSignal, out_utilisation: float, in_utilisation: float, target: int
    ) -> Decision:
        config = self._config
        if out_utilisation > config.scale_out_utilisation:
            if signal.current < target:
                return Decision(1, DecisionReason.UTILISATION_HIGH)
            return self._past_target(signal, +1)
        if in_utilisation < config.scale_in_utilisation:
            if signal.current > target:
                return Decision(-1, DecisionReason.UTILISATION_LOW)
            return self._past_target(signal, -1)
        return HOLD_IN_BAND

    def _past_target(self, signal: ScalingSignal, direction: int) -> Decision:
        """LT-U stops at the target; LT-UA overrides this to go past it."""
        return HOLD_AT_TARGET


class DeferredArimaGapScaler(DeferredUtilisationScaler):
    """LT-UA: LT-U, but at the end of the period a forecast far off the observed load lets
    utilisation keep scaling past the target."""

    strategy = ScalingStrategy.LT_UA
    __slots__ = ()

    def _past_target(self, signal: ScalingSignal, direction: int) -> Decision:
        config = self._config
        if not config.in_last_window(signal.now_s):
            return HOLD_AT_TARGET
        ratio = signal.load_ratio
        if ratio is None:
            return HOLD_AT_TARGET
        if direction > 0 and ratio >= config.up_factor:
            return Decision(1, DecisionReason.LOAD_ABOVE_FORECAST)
        if direction < 0 and ratio <= config.down_factor:
            return Decision(-1, DecisionReason.LOAD_BELOW_FORECAST)
        return HOLD_AT_TARGET


SCALERS: dict[ScalingStrategy, type[Scaler]] = {
    scaler.strategy: scaler
    for scaler in (
        ReactiveScaler,
        ImmediateScaler,
        DeferredUtilisationScaler,
        DeferredArimaGapScaler,
    )
}
"""The scaler class of each strategy name (the CRD's `spec.scaling.strategy`)."""


def make_scaler(
    strategy: ScalingStrategy, config: ScalingConfig, *, last_event_s: float | None = None
) -> Scaler:
    """A fresh scaler of the named strategy."""
    return SCALERS[strategy](config, last_event_s=last_event_s)
