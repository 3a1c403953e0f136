"""The hourly planning hook of the simulator and the simulated Prometheus series it reads.

The operator plans once per period: it reads tokens/s per (model, region) from Prometheus over
the last days, forecasts the next hour and solves for instances. The simulator records the same
series (`LoadRecorder`: interactive and NIW tokens/s arriving at each endpoint) and, at every
period start, hands them to an `HourlyPlanner`. The forecaster and ILP planner plug in through
that protocol; `LastHourPeakPlanner` is a deliberately simple stand-in for tests and for runs
without forecasting: the last hour's peak tokens/s, plus SageServe's NIW buffer, over an
instance's throughput, rounded up and kept within the region's bounds.

An endpoint is a ModelDeployment's `regions[]` entry: (model key, pool). A region's demand is
split over the model's pools in that region in proportion to their capacity at maxInstances
(in the examples each model has one pool per region, so nothing is split).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from fleetwarden.forecasting.series import Series
from fleetwarden.sim.fleet_spec import Fleet, Model

EndpointKey = tuple[str, str]
"""(ModelDeployment `namespace/name`, RegionPool name)."""


@dataclass(frozen=True)
class LoadHistory:
    """What Prometheus would hold for one endpoint: tokens/s per step, oldest first."""

    iw_tps: Series
    """Interactive tokens/s (prompt + output) arriving for this endpoint."""
    niw_tps: Series
    """NIW tokens/s submitted for this endpoint (SageServe's beta buffer is 10% of it)."""


@dataclass(frozen=True)
class PlanEntry:
    """The plan for one endpoint for the coming period."""

    target: int
    forecast_tps: float | None
    """The load the target was sized for (LT-UA compares observed load with it)."""


class HourlyPlanner(Protocol):
    """Given the history per endpoint and the fleet, the target instances per endpoint."""

    def plan(
        self,
        now_s: float,
        fleet: Fleet,
        history: Mapping[EndpointKey, LoadHistory],
        current: Mapping[EndpointKey, int],
    ) -> Mapping[EndpointKey, PlanEntry]: ...


@dataclass(frozen=True)
class LastHourPeakPlanner:
    """Target = ceil((peak of the last hour + niw_buffer x last hour's NIW) / throughput),
    within [minInstances, maxInstances]; with no history yet, the current count."""

    window_s: float = 3600.0
    niw_buffer: float | None = None
    """Fraction of NIW tokens/s added (None: the ModelDeployment's `forecast.niwBuffer`)."""

    def plan(
        self,
        now_s: float,
        fleet: Fleet,
        history: Mapping[EndpointKey, LoadHistory],
        current: Mapping[EndpointKey, int],
    ) -> Mapping[EndpointKey, PlanEntry]:
        plans: dict[EndpointKey, PlanEntry] = {}
        for key, load in history.items():
            model = fleet.models[key[0]]
            placement = model.placement(key[1])
            steps = max(1, round(self.window_s / load.iw_tps.step_s))
            iw = [v for v in load.iw_tps.values[-steps:] if math.isfinite(v)]
            niw = [v for v in load.niw_tps.values[-steps:] if math.isfinite(v)]
            if not iw:
                plans[key] = PlanEntry(current.get(key, placement.min_instances), None)
                continue
            beta = self.niw_buffer
            if beta is None:
                beta = model.spec.scaling.forecast.niw_buffer
            peak = max(iw) + beta * (sum(niw) / len(niw) if niw else 0.0)
            needed = math.ceil(peak / placement.throughput_tps - 1e-9)
            target = max(placement.min_instances, min(placement.max_instances, needed))
            plans[key] = PlanEntry(target, peak)
        return plans


def pool_shares(model: Model) -> dict[str, dict[str, float]]:
    """For each region of `model`, each pool's share of its demand (by capacity)."""
    shares: dict[str, dict[str, float]] = {}
    for region in model.regions:
        pools = [p for p in model.placements if p.region == region]
        total = sum(p.max_instances * p.throughput_tps for p in pools)
        shares[region] = {
            p.pool: (p.max_instances * p.throughput_tps / total) if total else 1 / len(pools)
            for p in pools
        }
    return shares


class LoadRecorder:
    """Tokens arriving per endpoint in fixed buckets: the simulated Prometheus series."""

    def __init__(self, bucket_s: float = 60.0) -> None:
        if bucket_s <= 0:
            raise ValueError("bucket_s must be > 0")
        self.bucket_s = bucket_s
        self._iw: dict[EndpointKey, list[float]] = {}
        self._niw: dict[EndpointKey, list[float]] = {}

    def add(self, key: EndpointKey, t: float, tokens: float, *, niw: bool) -> None:
        series = self._niw if niw else self._iw
        buckets = series.get(key)
        if buckets is None:  # not `setdefault(key, [])`: that builds a list on every request
            buckets = series[key] = []
        index = int(t // self.bucket_s)
        if index >= len(buckets):
            buckets.extend([0.0] * (index + 1 - len(buckets)))
        buckets[index] += tokens

    def _rates(self, key: EndpointKey, start: int, end: int, *, niw: bool) -> list[float]:
        buckets = (self._niw if niw else self._iw).get(key, [])
        return [
            (buckets[i] if i < len(buckets) else 0.0) / self.bucket_s for i in range(start, end)
        ]

    def observed_tps(self, key: EndpointKey, now: float, window_s: float) -> float | None:
        """Mean interactive tokens/s over the whole buckets of the last `window_s` (None before
        one bucket has passed), like `rate(...[5m])`."""
        end = int(now // self.bucket_s)
        start = max(0, end - max(1, round(window_s / self.bucket_s)))
        if end <= start:
            return None
        rates = self._rates(key, start, end, niw=False)
        return sum(rates) / len(rates)

    def history(self, key: EndpointKey, now: float, step_s: float, days: float) -> LoadHistory:
        """Tokens/s per `step_s` over the last `days` before `now` (whole steps only)."""
        per_step = max(1, round(step_s / self.bucket_s))
        end = int(now // self.bucket_s) // per_step * per_step
        start = max(0, end - int(days * 86400 / self.bucket_s) // per_step * per_step)
        series = []
        for niw in (False, True):
            rates = self._rates(key, start, end, niw=niw)
            values = tuple(
                sum(rates[i : i + per_step]) / per_step for i in range(0, len(rates), per_step)
            )
            series.append(Series(start * self.bucket_s, per_step * self.bucket_s, values))
        return LoadHistory(series[0], series[1])
