"""The operator's scaling memory: one scaler per (ModelDeployment, pool), the latest measured
signals and plans, and the decision for one region when its reconcile runs.

Scaling decisions are taken inside the ModelDeployment's reconcile, not in a separate timer that
writes on its own: the reconcile is the only writer of the Deployment's replicas and of the
status that records them, so a plan, a scaling step and a user's spec change can never race. The
metrics poller only refreshes `signals` and asks for a reconcile. No I/O here; the clock is passed.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec, RegionPlacement
from fleetwarden.operator.spot_signals import SpotSignals
from fleetwarden.scaling import Decision, Scaler, ScalingConfig, ScalingSignal, make_scaler

RegionKey = tuple[str, str]
"""(ModelDeployment key `namespace/name`, pool name)."""


@dataclass(frozen=True)
class RegionSignal:
    """What Prometheus said about one region at `observed_s`."""

    observed_s: float
    utilisation: float | None
    load_tps: float | None


class RegionPlanError(ValueError):
    """A plan whose period cannot describe a planning interval (not finite, or not > 0)."""


@dataclass(frozen=True)
class RegionPlan:
    """The last plan for one region: target instances and the forecast it was made for."""

    target: int
    forecast_peak_tps: float | None
    period_s: float | None = None
    """Seconds between the plan rounds this plan belongs to (the planner's period: the fleet's
    shortest `horizonSeconds`); LT-UA's window is the last `lastWindowMinutes` of it, so it
    comes with the plan rather than from the operator. None: the autoscaler's `period_s`."""

    def __post_init__(self) -> None:
        period = self.period_s
        if period is not None and not (math.isfinite(period) and period > 0):
            raise RegionPlanError(f"period_s must be finite and > 0, got {period}")


@dataclass(frozen=True)
class ScalingStep:
    """A decision taken in a reconcile, for status and Events."""

    before: int
    after: int
    decision: Decision


@dataclass
class Autoscaler:
    """Scalers and the facts they decide on, kept across reconciles for the operator's life."""

    max_signal_age_s: float = 120.0
    """Older signals are not acted on (the poller failed): hold, never guess."""
    period_s: float = 3600.0
    """The planning period of a plan that does not carry its own (`RegionPlan.period_s`)."""
    health: tuple[bool, str, str] | None = None
    """(healthy, reason, message) of Prometheus itself; None before the first poll."""
    missing: dict[str, list[str]] = field(default_factory=dict)
    """ModelDeployment key -> its regions with no utilisation series in the last poll."""
    missing_load: dict[str, list[str]] = field(default_factory=dict)
    """ModelDeployment key -> its regions with utilisation but no tokens/s series in the last
    poll (LT-UA cannot compare load with the forecast there)."""
    signals: dict[RegionKey, RegionSignal] = field(default_factory=dict)
    plans: dict[RegionKey, RegionPlan] = field(default_factory=dict)
    spot: SpotSignals = field(default_factory=SpotSignals)
    """NIW backlog per (served model, region), the input of spot Deployment replicas."""
    _scalers: dict[RegionKey, tuple[ScalingConfig, str, Scaler]] = field(default_factory=dict)

    def _scaler(
        self,
        key: RegionKey,
        spec: ModelDeploymentSpec,
        placement: RegionPlacement,
        plan: RegionPlan | None,
    ) -> Scaler:
        period = plan.period_s if plan is not None and plan.period_s is not None else None
        config = ScalingConfig.from_settings(
            spec.scaling,
            min_instances=placement.min_instances,
            max_instances=placement.max_instances,
            period_s=self.period_s if period is None else period,
            leave_zero_toward_target=True,  # no pod, no series: only the plan can call for one
        )
        strategy = spec.scaling.strategy
        known = self._scalers.get(key)
        if known is not None and known[0] == config and known[1] == strategy.value:
            return known[2]
        last_event = known[2].last_event_s if known is not None else None
        scaler = make_scaler(strategy, config, last_event_s=last_event)
        self._scalers[key] = (config, strategy.value, scaler)
        return scaler

    def step(
        self,
        model_deployment: str,
        spec: ModelDeploymentSpec,
        placement: RegionPlacement,
        current: int,
        now_s: float,
        starting: int = 0,
    ) -> ScalingStep | None:
        """The scaling decision for one region now, or None when there is nothing to decide on
        and the replicas hold: Prometheus is failing (fail static, whatever the last readings
        said), or there is no fresh signal (the poller is off, or the region has no series).
        `starting` of the `current` replicas are not ready yet (`ScalingSignal.starting`).

        A region at 0 replicas with a plan above 0 is decided without a signal: no instance can
        report one, and the scaler's zero guard steps it up. A signal moves the region at most
        once: the scaler holds a reading observed before its last scaling event."""
        key = (model_deployment, placement.pool)
        signal = self.signals.get(key)
        plan = self.plans.get(key)
        prometheus_down = self.health is not None and not self.health[0]
        fresh = signal is not None and now_s - signal.observed_s <= self.max_signal_age_s
        reading = signal if fresh and not prometheus_down else None
        leaving_zero = current == 0 and plan is not None and plan.target > 0
        if reading is None and (prometheus_down or not leaving_zero):
            known = self._scalers.get(key)
            if known is not None:  # no data is a break in the scale-in stabilisation run
                known[2].decide(ScalingSignal(now_s, current, current, utilisation=None))
            return None
        scaler = self._scaler(key, spec, placement, plan)
        decision = scaler.decide(
            ScalingSignal(
                now_s=now_s,
                current=current,
                target=plan.target if plan is not None else current,
                utilisation=reading.utilisation if reading is not None else None,
                observed_load_tps=reading.load_tps if reading is not None else None,
                forecast_load_tps=plan.forecast_peak_tps if plan is not None else None,
                starting=max(0, min(starting, current)),
            ),
            observed_s=reading.observed_s if reading is not None else None,
        )
        return ScalingStep(current, current + decision.step, decision)

    def health_of(self, model_deployment: str) -> tuple[bool, str, str] | None:
        """The Scaling condition of one ModelDeployment: Prometheus down, or series missing."""
        if self.health is None or not self.health[0]:
            return self.health
        regions = self.missing.get(model_deployment)
        if regions:
            message = f"no utilisation series for {', '.join(regions)}; they hold their replicas"
            return (False, "NoMetrics", message)
        no_load = self.missing_load.get(model_deployment)
        if no_load:
            message = (
                f"utilisation is read from Prometheus, but there is no tokens/s series for "
                f"{', '.join(no_load)}: LT-UA cannot compare load with the forecast there and "
                "scales as LT-U"
            )
            return (True, self.health[1], message)
        return self.health

    def forget(self, model_deployment: str) -> None:
        self.missing.pop(model_deployment, None)
        self.missing_load.pop(model_deployment, None)
        for store in (self.signals, self.plans, self._scalers):
            for key in [k for k in store if k[0] == model_deployment]:
                del store[key]

    def forget_regions(self, model_deployment: str, keep_pools: Collection[str]) -> None:
        """Drop the signals, plans and scalers of `model_deployment`'s pools outside
        `keep_pools`: regions its spec no longer names would otherwise be kept for its life."""
        for store in (self.signals, self.plans, self._scalers):
            for key in [k for k in store if k[0] == model_deployment and k[1] not in keep_pools]:
                del store[key]
