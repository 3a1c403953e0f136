"""Build the scheduling policy a fairness config asks for: one place, keyed by the policy enum.

The sidecar and the simulator both build their policies here, so a TenantPolicy means the same
thing in production and in a simulated fleet.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetwarden.api.enums import LengthPrediction, PolicyName
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.drr import DeficitRoundRobin
from fleetwarden.fairness.fcfs import FirstComeFirstServed
from fleetwarden.fairness.ordering import queue_factory
from fleetwarden.fairness.prediction import MovingAverage
from fleetwarden.fairness.request import Request, SchedulingPolicy
from fleetwarden.fairness.vtc import LeastCounterFirst, TokenPrices, VirtualTokenCounter
from fleetwarden.fairness.wsc import WeightedServiceCounter


def tenant_weight(config: FairnessConfig) -> Callable[[str], float]:
    """The tenant's weight under `config` (frozen, so its tables are read once, not per charge:
    weighted VTC asks on every charged token event)."""
    tenants, defaults = config.tenants, config.defaults

    def weight(tenant: str) -> float:
        settings = tenants.get(tenant)
        return (settings or defaults).weight

    return weight


def uses_weights(config: FairnessConfig) -> bool:
    return config.defaults.weight != 1.0 or any(t.weight != 1.0 for t in config.tenants.values())


def build_policy(
    config: FairnessConfig, *, predictor: MovingAverage | None = None
) -> SchedulingPolicy:
    """The policy of `config`. For VTC with `length_prediction: moving-average`, pass the
    predictor the shell feeds with completed requests' output lengths."""
    if config.policy is PolicyName.WSC:
        return WeightedServiceCounter.from_config(config)
    if config.policy is PolicyName.DRR:
        return DeficitRoundRobin.from_config(config)  # priority ordering includes deadlines
    queues = queue_factory(
        config.ordering,
        severely_expired_s=config.dpa.severely_expired_s,
        urgent_within_s=config.dpa.urgent_within_s,
    )
    if config.policy is PolicyName.FCFS:
        return FirstComeFirstServed(queues)
    prices = TokenPrices(input=config.token_weights.input, output=config.token_weights.output)
    weights = tenant_weight(config) if uses_weights(config) else None
    predict: Callable[[Request], int | None] | None = None
    if config.length_prediction is LengthPrediction.MOVING_AVERAGE:
        average = predictor or MovingAverage()
        predict = lambda request: average.predict(request.tenant)  # noqa: E731
    cls = LeastCounterFirst if config.policy is PolicyName.LCF else VirtualTokenCounter
    return cls(prices, weights=weights, predict=predict, queue_factory=queues)
