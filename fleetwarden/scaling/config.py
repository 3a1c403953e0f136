"""Knobs of the scaling strategies, validated once so the strategies never meet nonsense.

One `ScalingConfig` describes one (model, region): its bounds come from the ModelDeployment's
region placement and its thresholds from `spec.scaling`; `from_settings` builds it from those.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetwarden.api.v1alpha1.modeldeployment import ScalingSettings

METRICS_POLL_INTERVAL_S = 15.0
"""Seconds between two readings of utilisation and load, hence between two scaling evaluations
of a region: the operator's metrics poll (its default `metrics_interval_seconds`) and the
simulator's scaling tick, here so both shells take it from one place (the simulator may not
import the operator)."""


class ScalingConfigError(ValueError):
    """A threshold, bound or time window that cannot describe a working scaler."""


@dataclass(frozen=True, slots=True)
class ScalingConfig:
    """Thresholds, bounds and timing shared by all strategies (each reads the ones it needs)."""

    max_instances: int
    """Most instances in the region; no strategy ever steps above it."""
    min_instances: int = 0
    """Fewest instances in the region; no strategy ever steps below it."""
    scale_out_utilisation: float = 0.70
    """Utilisation (0..1) above which reactive adds and LT-U/LT-UA move up. SageServe: 0.70."""
    scale_in_utilisation: float = 0.30
    """Utilisation (0..1) below which reactive removes and LT-U/LT-UA move down. SageServe: 0.30."""
    cooldown_s: float = 15.0
    """Seconds between two scaling events of the region. SageServe's reactive baseline: 15 s."""
    period_s: float = 3600.0
    """Seconds between plans: the "hour" whose last minutes LT-UA treats specially."""
    period_offset_s: float = 0.0
    """Where periods start: period k is [k*period_s + offset, (k+1)*period_s + offset). The
    default aligns periods with wall-clock hours, which is when the operator plans."""
    last_window_s: float = 1200.0
    """LT-UA: length of the end-of-period window in which it may pass the target. SageServe: the
    last 20 minutes; 0 turns LT-UA into LT-U."""
    up_factor: float = 5.0
    """LT-UA: pass the target upward when observed load >= up_factor x forecast. SageServe: 5."""
    down_factor: float = 0.5
    """LT-UA: pass the target downward when observed load <= down_factor x forecast. SageServe:
    0.5."""
    scale_in_stabilisation_s: float = 0.0
    """Seconds the strategy's rule must have asked for -1 at every evaluation before an instance
    is removed (HPA's scale-down stabilisation window). 0, the default, removes at the first ask,
    as SageServe's strategies do; scale-out and the bounds guards never wait for it."""
    leave_zero_toward_target: bool = False
    """At 0 instances with a target above 0, step up without a reading (after the cooldown).
    For shells that cannot observe demand at 0: the operator reads utilisation from the pods, and
    with no pod there is none, so a region with `min_instances` 0 would otherwise stay at 0 for
    good. The operator and the simulator both set it (the simulator has no reading at an empty
    region either). Off by default: without a shell's say-so, missing data never moves a
    region."""

    def __post_init__(self) -> None:
        for name in (
            "scale_out_utilisation",
            "scale_in_utilisation",
            "cooldown_s",
            "period_s",
            "period_offset_s",
            "last_window_s",
            "up_factor",
            "down_factor",
            "scale_in_stabilisation_s",
        ):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ScalingConfigError(f"{name} must be finite, got {value}")
        if not 0 <= self.min_instances <= self.max_instances:
            raise ScalingConfigError(
                f"need 0 <= min_instances ({self.min_instances}) <= max_instances "
                f"({self.max_instances})"
            )
        if not 0.0 <= self.scale_in_utilisation < self.scale_out_utilisation <= 1.0:
            raise ScalingConfigError(
                f"need 0 <= scale_in_utilisation ({self.scale_in_utilisation}) < "
                f"scale_out_utilisation ({self.scale_out_utilisation}) <= 1"
            )
        if self.cooldown_s <= 0:
            raise ScalingConfigError(f"cooldown_s must be > 0, got {self.cooldown_s}")
        if self.period_s <= 0:
            raise ScalingConfigError(f"period_s must be > 0, got {self.period_s}")
        if not 0.0 <= self.last_window_s <= self.period_s:
            raise ScalingConfigError(
                f"need 0 <= last_window_s ({self.last_window_s}) <= period_s ({self.period_s})"
            )
        if self.scale_in_stabilisation_s < 0:
            raise ScalingConfigError(
                f"scale_in_stabilisation_s must be >= 0, got {self.scale_in_stabilisation_s}"
            )
        if not 0.0 < self.down_factor < 1.0 < self.up_factor:
            raise ScalingConfigError(
                f"need 0 < down_factor ({self.down_factor}) < 1 < up_factor ({self.up_factor})"
            )

    @classmethod
    def from_settings(
        cls,
        settings: ScalingSettings,
        *,
        min_instances: int,
        max_instances: int,
        period_s: float = 3600.0,
        period_offset_s: float = 0.0,
        leave_zero_toward_target: bool = False,
    ) -> ScalingConfig:
        """The config of one region from its ModelDeployment's `spec.scaling` and placement.

        The period is not in the CRD: it is the planning interval of the plan in force, passed by
        the shell. `lastWindowMinutes` is clamped to it: a plan made every 10 minutes has no last
        20 minutes, and its whole period is the closest window it has.
        """
        return cls(
            max_instances=max_instances,
            min_instances=min_instances,
            scale_out_utilisation=settings.scale_out_utilization,
            scale_in_utilisation=settings.scale_in_utilization,
            cooldown_s=float(settings.cooldown_seconds),
            period_s=period_s,
            period_offset_s=period_offset_s,
            last_window_s=min(60.0 * settings.last_window_minutes, period_s),
            up_factor=settings.up_factor,
            down_factor=settings.down_factor,
            scale_in_stabilisation_s=float(settings.scale_in_stabilization_seconds),
            leave_zero_toward_target=leave_zero_toward_target,
        )

    def clamp(self, instances: int) -> int:
        """`instances` brought inside [min_instances, max_instances]."""
        return max(self.min_instances, min(self.max_instances, instances))

    def in_last_window(self, now_s: float) -> bool:
        """Whether `now_s` falls in the last `last_window_s` seconds of its period.

        The window is half-open, [end - last_window_s, end): at the period's end a new period (and
        normally a new plan) begins, so the old plan's window is over.
        """
        if self.last_window_s <= 0:
            return False
        into_period = (now_s - self.period_offset_s) % self.period_s
        return into_period >= self.period_s - self.last_window_s
