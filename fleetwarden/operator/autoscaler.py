"""The operator's scaling memory: one scaler per (ModelDeployment, pool), the latest measured
signals and plans, and the decision for one region when its reconcile runs.

Scaling decisions are taken inside the ModelDeployment's reconcile, not in a separate timer that
writes on its own: the reconcile is the only writer of the Deployment's replicas and of the
status that records them, so a plan, a scaling step and a user's spec change can never race. The
metrics poller only refreshes `signals` and asks for a reconcile. No I/O here; the clock is passed.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class RegionPlan:
    """The last plan for one region: target instances and the forecast it was made for."""

    target: int
    forecast_peak_tps: float | None


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
    health: tuple[bool, str, str] | None = None
    """(healthy, reason, message) of Prometheus itself; None before the first poll."""
    missing: dict[str, list[str]] = field(default_factory=dict)
    """ModelDeployment key -> its regions with no utilisation series in the last poll."""
    signals: dict[RegionKey, RegionSignal] = field(default_factory=dict)
    plans: dict[RegionKey, RegionPlan] = field(default_factory=dict)
    spot: SpotSignals = field(default_factory=SpotSignals)
    """NIW backlog per (served model, region), the input of spot Deployment replicas."""
    _scalers: dict[RegionKey, tuple[ScalingConfig, str, Scaler]] = field(default_factory=dict)

    def _scaler(
        self, key: RegionKey, spec: ModelDeploymentSpec, placement: RegionPlacement
    ) -> Scaler:
        config = ScalingConfig.from_settings(
            spec.scaling,
            min_instances=placement.min_instances,
            max_instances=placement.max_instances,
            period_s=self.period_s,
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
        (no fresh signal: the poller is off or failing, and the replicas hold). `starting` of the
        `current` replicas are not ready yet (`ScalingSignal.starting`)."""
        key = (model_deployment, placement.pool)
        signal = self.signals.get(key)
        if signal is None or now_s - signal.observed_s > self.max_signal_age_s:
            known = self._scalers.get(key)
            if known is not None:  # no data is a break in the scale-in stabilisation run
                known[2].decide(ScalingSignal(now_s, current, current, utilisation=None))
            return None
        plan = self.plans.get(key)
        scaler = self._scaler(key, spec, placement)
        decision = scaler.decide(
            ScalingSignal(
                now_s=now_s,
                current=current,
                target=plan.target if plan is not None else current,
                utilisation=signal.utilisation,
                observed_load_tps=signal.load_tps,
                forecast_load_tps=plan.forecast_peak_tps if plan is not None else None,
                starting=max(0, min(starting, current)),
            )
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
        return self.health

    def forget(self, model_deployment: str) -> None:
        self.missing.pop(model_deployment, None)
        for store in (self.signals, self.plans, self._scalers):
            for key in [k for k in store if k[0] == model_deployment]:
                del store[key]
