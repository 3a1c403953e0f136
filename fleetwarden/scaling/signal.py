"""What a scaling strategy is told (`ScalingSignal`) and what it answers (`Decision`).

Both are frozen values so a decision can be logged, compared in tests and replayed in the
simulator: the same signal sequence always yields the same decisions. Units are in the names:
times are seconds since the epoch (the shell's clock, passed in), loads are tokens per second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class SignalError(ValueError):
    """A signal that no shell should build: negative replica counts or a non-finite clock."""


class DecisionReason(StrEnum):
    """Why a strategy answered +1, -1 or 0. Values are stable: they appear in Events and status.

    Hold reasons (step 0) come first, then the reasons that move.
    """

    MISSING_UTILISATION = "missing-utilisation"
    """No usable utilisation (None, NaN, infinite or negative): hold, never scale on no data."""
    COOLDOWN = "cooldown"
    """The previous scaling event is less than `cooldown_s` ago."""
    AT_MAX = "at-max"
    """The rule asked for +1 but the region already runs `max_instances`."""
    AT_MIN = "at-min"
    """The rule asked for -1 but the region already runs `min_instances`."""
    AT_TARGET = "at-target"
    """The plan's target caps the move (LT-I at target; LT-U/LT-UA with the target reached)."""
    SCALE_IN_STABILISING = "scale-in-stabilising"
    """The rule asked for -1, but it has not asked at every evaluation for
    `scale_in_stabilisation_s` yet (the scale-in stabilisation window)."""
    IN_BAND = "utilisation-in-band"
    """Utilisation is between the scale-in and scale-out thresholds."""
    BELOW_MIN = "below-min"
    """+1: the region runs fewer than `min_instances` (the bounds changed under it)."""
    ABOVE_MAX = "above-max"
    """-1: the region runs more than `max_instances`."""
    UTILISATION_HIGH = "utilisation-high"
    """+1: utilisation is above the scale-out threshold (and, for LT-U/LT-UA, below target)."""
    UTILISATION_LOW = "utilisation-low"
    """-1: utilisation is below the scale-in threshold (and, for LT-U/LT-UA, above target)."""
    TOWARD_TARGET = "toward-target"
    """LT-I: +1 or -1 toward the plan's target, whatever the utilisation."""
    LOAD_ABOVE_FORECAST = "load-above-forecast"
    """LT-UA, last minutes of the hour: +1 past the target, observed load >= up_factor x forecast."""
    LOAD_BELOW_FORECAST = "load-below-forecast"
    """LT-UA, last minutes of the hour: -1 past the target, observed load <= down_factor x
    forecast."""


@dataclass(frozen=True, slots=True)
class Decision:
    """One scaling answer: `step` is +1 (add an instance), -1 (remove one) or 0 (hold)."""

    step: int
    reason: DecisionReason

    def __post_init__(self) -> None:
        if self.step not in (-1, 0, 1):
            raise ValueError(f"step must be -1, 0 or +1, got {self.step}")


@dataclass(frozen=True, slots=True)
class ScalingSignal:
    """The facts about one (model, region) at one moment.

    `utilisation` is SageServe's effective memory utilisation: the KV-cache usage fraction of the
    region's instances, model weights excluded (vLLM's `kv_cache_usage_perc` is that fraction).
    It must be the mean over the instances that measured one, which are the ready ones: it is
    `promql.utilisation()`, an `avg` over the series Prometheus has, and a sidecar exports no
    series while its engine has not answered (loading the model) or its reading is stale; the
    simulator likewise averages its ready instances only. Starting instances are therefore not
    in it, and are accounted for here, once (`scale_out_utilisation`). A shell that averaged
    them in as 0 would count them twice on scale-out and as idle on scale-in.
    `observed_load_tps` and `forecast_load_tps` are tokens/s now and the forecast the current plan
    was made for; only LT-UA reads them, and a missing one just disables its past-target rule.
    """

    now_s: float
    current: int
    target: int
    utilisation: float | None
    observed_load_tps: float | None = None
    forecast_load_tps: float | None = None
    starting: int = 0
    """Instances counted in `current` that do not serve yet (loading the model): they are not in
    `utilisation` (they export none), but they are capacity already bought (see
    `scale_out_utilisation`)."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.now_s):
            raise SignalError(f"now_s must be finite, got {self.now_s}")
        if self.current < 0:
            raise SignalError(f"current must be >= 0, got {self.current}")
        if not 0 <= self.starting <= self.current:
            raise SignalError(
                f"starting must be in [0, current={self.current}], got {self.starting}"
            )
        if self.target < 0:
            raise SignalError(f"target must be >= 0, got {self.target}")

    @property
    def usable_utilisation(self) -> float | None:
        """The utilisation if it can be acted on, else None; scale-in reads it as it is.

        It is the ready instances' own mean (see the class docstring), which is what scale-in
        must judge: instances still loading serve nothing, and counting them as idle would remove
        the capacity just bought. NaN and infinities come from empty PromQL averages and broken
        exporters; a negative fraction cannot be a real measurement. Values above 1 are kept:
        they only say "full".
        """
        value = self.utilisation
        if value is None or not math.isfinite(value) or value < 0:
            return None
        return value

    @property
    def scale_out_utilisation(self) -> float | None:
        """The utilisation a scale-out decision reads: starting instances count as empty capacity.

        The ready instances' mean usage (`utilisation`) is spread over ready plus starting
        instances: mean x ready / current, as Kubernetes' HorizontalPodAutoscaler treats
        not-yet-ready pods as 0% on scale-up. Without it, a model load of minutes against a
        cooldown of seconds adds an instance every cooldown while the first one loads, and a
        region runs to `max_instances` on one burst (the flapping the simulator showed for the
        reactive baseline). This is the only place starting instances are discounted: it is
        right because `utilisation` does not contain them (3 ready at 0.95 and 1 loading read
        0.7125 here; had the loading one been averaged in as 0 upstream as well, 0.534).
        Scale-in reads `usable_utilisation` itself: counting capacity that serves nothing as idle
        would remove instances it just bought.
        """
        value = self.usable_utilisation
        if value is None or not self.starting:
            return value
        ready = self.current - self.starting
        return value * ready / self.current

    @property
    def load_ratio(self) -> float | None:
        """Observed over forecast load, or None when either is missing or the forecast is not > 0.

        A zero forecast gives no ratio rather than infinity: a plan made for no load says nothing
        about how wrong the forecast is, and LT-UA must not run to max on a division by zero.
        """
        observed, forecast = self.observed_load_tps, self.forecast_load_tps
        if observed is None or forecast is None:
            return None
        if not (math.isfinite(observed) and math.isfinite(forecast)):
            return None
        if observed < 0 or forecast <= 0:
            return None
        return observed / forecast
