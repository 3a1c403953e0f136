"""Arrival rates for the fluid simulator: tokens/s per (served model, region) and tier, per step.

The fluid mode never generates requests; it reads a `RateModel`:

- `BuiltinRates` restates the built-in workload's rate model (`BuiltinWorkload`): the same peak
  requests/s per (model, region), daily and weekly cycle, bursts, tier mix and NIW rate, times
  the applications' mean prompt plus output tokens. With 60 s steps aligned with the workload's
  60 s slots, a step's rate is exactly the rate the request generator draws that slot from.
- `ServeGenRates` reads ServeGen's released per-client, per-10-minute-window rates directly
  (times the sampling fraction and the client's mean prompt plus output tokens from its length
  quantiles), with the same synthetic region and tier per client and the same collection-gap
  fill and wrap-around as the request regeneration (`ServeGenWorkload`); it draws no request,
  so a day at fraction 1 costs the same as at 0.001. What it drops is burstiness within a
  window (the fitted Gamma/Weibull CV): the fluid step sees each window's mean rate.
- `BinnedRates` bins any request stream (a trace) into per-step rates: it reads the requests
  once, so it is for replaying a workload that exists, not for speed.

`rate_model_for` picks the one that fits a workload spec: what `fleetwarden simulate
--fidelity fluid` runs in every worker.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fleetwarden.api.enums import Tier
from fleetwarden.sim.fleet_spec import Fleet
from fleetwarden.sim.workload import QuantileLength, SimRequest
from fleetwarden.sim.workload_builtin import HOUR_S, WEEKEND_FACTOR, BuiltinWorkload

if TYPE_CHECKING:
    from fleetwarden.sim.servegen_workload import ServeGenWorkload

StreamKey = tuple[str, str]
"""(served model name, region)."""


@dataclass(frozen=True, slots=True)
class StepRates:
    """Mean tokens/s (prompt + output) arriving over one step, per tier."""

    iw_fast: float = 0.0
    iw_normal: float = 0.0
    niw: float = 0.0

    @property
    def iw(self) -> float:
        return self.iw_fast + self.iw_normal


@dataclass(frozen=True, slots=True)
class Lengths:
    """Mean prompt and output tokens of one stream's requests (for request counts and TTFT)."""

    input_tokens: float
    output_tokens: float

    @property
    def total(self) -> float:
        return self.input_tokens + self.output_tokens


class RateModel(Protocol):
    """What the fluid simulator reads about the workload."""

    def rates(self, t0: float, t1: float) -> Mapping[StreamKey, StepRates]:
        """Mean tokens/s per stream over [t0, t1)."""
        ...

    def lengths(self, model: str) -> Lengths:
        """Mean request lengths of a served model."""
        ...


class BuiltinRates:
    """The built-in workload's rate model, without drawing any request (module docstring)."""

    def __init__(self, workload: BuiltinWorkload, fleet: Fleet) -> None:
        self.workload = workload
        peaks = workload.peak_rates(fleet)
        peak_cycle = workload.peak_cycle()
        f, n, niw = workload.tiers.normalised()
        # IW-F's share of each model's interactive requests, as the request-level workload
        # draws it: its TenantPolicy's tenants' tiers when the policy names tenants.
        self._fast_share = {m.served_name: workload.fast_share(m) for m in fleet.models.values()}
        weekly_mean = (5 + 2 * WEEKEND_FACTOR) / 7
        self._iw_mean = {key: rate / peak_cycle for key, rate in peaks.items()}
        self._niw_rate = {
            key: (mean * weekly_mean * niw / (f + n) if f + n > 0 else 0.0)
            for key, mean in self._iw_mean.items()
        }
        apps = workload.apps.values()
        total = sum(a.share for a in apps)
        self._lengths = Lengths(
            sum(a.share * a.input.mean for a in apps) / total,
            sum(a.share * a.output.mean for a in apps) / total,
        )

    def rates(self, t0: float, t1: float) -> dict[StreamKey, StepRates]:
        workload, mid = self.workload, (t0 + t1) / 2
        tokens = self._lengths.total
        out: dict[StreamKey, StepRates] = {}
        for (model, region), mean in self._iw_mean.items():
            iw = mean * workload.cycle(mid, region)
            for burst in workload.bursts:
                if burst.start_s <= mid < burst.start_s + burst.duration_s and burst.applies(
                    model, region
                ):
                    iw *= burst.factor
            out[model, region] = StepRates(
                iw * self._fast_share[model] * tokens,
                iw * (1 - self._fast_share[model]) * tokens,
                self._niw_rate[model, region] * tokens,
            )
        return out

    def lengths(self, model: str) -> Lengths:
        return self._lengths

    def horizon_s(self) -> float:
        return self.workload.duration_s if self.workload.duration_s else math.inf


@dataclass
class BinnedRates:
    """Per-step rates of an existing request stream (module docstring)."""

    step_s: float
    bins: dict[int, dict[StreamKey, list[float]]] = field(default_factory=dict)
    _lengths: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def from_requests(
        cls, requests: Iterable[SimRequest], fleet: Fleet, step_s: float = 60.0
    ) -> BinnedRates:
        """Bin `requests` by step; tiers as the simulator assigns them (request, else tenant)."""
        binned = cls(step_s)
        slot = {Tier.IW_FAST: 0, Tier.IW_NORMAL: 1, Tier.NIW: 2}
        for item in requests:
            model = fleet.model(item.model)
            config = model.fairness
            tier = item.tier or config.tenants.get(item.tenant, config.defaults).tier
            tokens = item.input_tokens + item.output_tokens
            step = binned.bins.setdefault(int(item.arrival_s // step_s), {})
            step.setdefault((model.served_name, item.region), [0.0, 0.0, 0.0])[slot[tier]] += tokens
            sums = binned._lengths.setdefault(model.served_name, [0.0, 0.0, 0.0])
            sums[0] += item.input_tokens
            sums[1] += item.output_tokens
            sums[2] += 1
        return binned

    def rates(self, t0: float, t1: float) -> dict[StreamKey, StepRates]:
        out: dict[StreamKey, list[float]] = {}
        first, last = int(t0 // self.step_s), math.ceil(t1 / self.step_s)
        for index in range(first, last):
            for key, tokens in self.bins.get(index, {}).items():
                acc = out.setdefault(key, [0.0, 0.0, 0.0])
                for i in range(3):
                    acc[i] += tokens[i]
        span = max(t1 - t0, 1e-9)
        return {k: StepRates(v[0] / span, v[1] / span, v[2] / span) for k, v in out.items()}

    def lengths(self, model: str) -> Lengths:
        sums = self._lengths.get(model)
        if not sums or not sums[2]:
            return Lengths(1000.0, 200.0)
        return Lengths(sums[0] / sums[2], sums[1] / sums[2])


def quantile_mean(q: QuantileLength) -> float:
    """Mean of `QuantileLength`'s distribution: the integral of its log-linear inverse CDF, so
    the fluid token rate is what the request regeneration draws on average."""
    qs, logv = q.knots()
    total = 0.0
    for q0, q1, a, b in zip(qs[:-1], qs[1:], logv[:-1], logv[1:], strict=True):
        width = float(q1 - q0)
        if abs(b - a) < 1e-12:
            total += width * math.exp(a)
        else:
            total += width * (math.exp(b) - math.exp(a)) / float(b - a)
    return total


class ServeGenRates:
    """ServeGen's released per-window rates as fluid arrivals (module docstring)."""

    def __init__(self, workload: ServeGenWorkload, fleet: Fleet) -> None:
        from fleetwarden.forecasting import servegen as sg
        from fleetwarden.sim.servegen_workload import ServeGenModelStream
        from fleetwarden.sim.workload import RegionRule

        self.window_s = sg.WINDOW_S
        self.token_window_s = sg.TOKEN_WINDOW_S
        self.start_s = workload.start_s
        self.slots: dict[int, dict[StreamKey, list[float]]] = {}
        self._lengths: dict[str, Lengths] = {}
        slot = {Tier.IW_FAST: 0, Tier.IW_NORMAL: 1, Tier.NIW: 2}
        first = int(workload.start_s // self.window_s)
        last = math.ceil((workload.start_s + workload.duration_s) / self.window_s)
        for index, (source, served) in enumerate(sorted(workload.mapping(fleet).items())):
            regions = fleet.model(served).regions
            weights = {r: (workload.region_weights or {}).get(r, 1.0) for r in regions}
            stream = ServeGenModelStream(workload, index, source, served, RegionRule(weights))
            means: dict[tuple[int, int, str], float] = {}
            sums = [0.0, 0.0, 0.0]  # requests/s x input, x output, requests/s
            for number in range(first, last):
                t_s = number * int(self.window_s)
                window_of = stream.source_window(t_s)
                step = self.slots.setdefault(number, {})
                for window in stream.windows.get(window_of, []):
                    rate = window.rate * workload.fraction
                    lengths = [
                        self._mean(means, stream.lengths, window.client, window_of, name)
                        for name in ("input_tokens", "output_tokens")
                    ]
                    key = f"{source}/{window.client}"
                    where = (served, stream.rule.region(key))
                    acc = step.setdefault(where, [0.0, 0.0, 0.0])
                    acc[slot[workload.tiers.of_key(key)]] += rate * (lengths[0] + lengths[1])
                    sums[0] += rate * lengths[0]
                    sums[1] += rate * lengths[1]
                    sums[2] += rate
            if sums[2] > 0:
                self._lengths[served] = Lengths(sums[0] / sums[2], sums[1] / sums[2])

    def _mean(
        self,
        cache: dict[tuple[int, int, str], float],
        lengths: Any,
        client: int,
        t_s: int,
        name: str,
    ) -> float:
        """A client's mean length in its 6-hour token window, computed once per window."""
        window = t_s // self.token_window_s * self.token_window_s
        key = (client, window, name)
        if key not in cache:
            cache[key] = quantile_mean(lengths.get(client, t_s, name))
        return cache[key]

    def rates(self, t0: float, t1: float) -> dict[StreamKey, StepRates]:
        """Rates over [t0, t1): each window's rate weighted by its overlap with the step."""
        out: dict[StreamKey, list[float]] = {}
        span = max(t1 - t0, 1e-9)
        a, b = t0 + self.start_s, t1 + self.start_s
        for number in range(int(a // self.window_s), math.ceil(b / self.window_s)):
            lo, hi = number * self.window_s, (number + 1) * self.window_s
            weight = (min(b, hi) - max(a, lo)) / span
            if weight <= 0:
                continue
            for key, tps in self.slots.get(number, {}).items():
                acc = out.setdefault(key, [0.0, 0.0, 0.0])
                for i in range(3):
                    acc[i] += tps[i] * weight
        return {k: StepRates(v[0], v[1], v[2]) for k, v in out.items()}

    def lengths(self, model: str) -> Lengths:
        return self._lengths.get(model, Lengths(1000.0, 200.0))


def rate_model_for(source: Any, fleet: Fleet, step_s: float = 60.0) -> RateModel:
    """The fluid rate model of a workload spec: the built-in and ServeGen specs are read as
    rates (no request drawn); anything else (a trace) is built and binned."""
    from fleetwarden.sim.servegen_workload import ServeGenWorkload

    if isinstance(source, BuiltinWorkload):
        source.build(fleet)  # validates the spec as the request-level run does
        return BuiltinRates(source, fleet)
    if isinstance(source, ServeGenWorkload):
        source.build(fleet)  # data present, fraction in range
        return ServeGenRates(source, fleet)
    return BinnedRates.from_requests(source.build(fleet), fleet, step_s)


__all__ = [
    "HOUR_S",
    "BinnedRates",
    "BuiltinRates",
    "Lengths",
    "RateModel",
    "ServeGenRates",
    "StepRates",
    "quantile_mean",
    "rate_model_for",
]
