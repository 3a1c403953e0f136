"""Fairness metrics of a replay, as the VTC and FairServe papers define them.

Service is the VTC paper's weighted token count, cost = w_in * input + w_out * output (1 and 2 by
default, OpenAI pricing), received uniformly from a request's first token to its completion (or
to the end of the replay for a request still running). Demand is the same cost counted at arrival.

- `service_difference`: the VTC paper's table metric. Windows of 2T = 60 s centred on `ticks`
  evenly spaced ticks, the first window starting after the warm-up; at each tick, with s_i and d_i
  the service and demand rates of tenant i and s_max the largest service rate, the difference is
  sum_i min(s_max - s_i, |d_i - s_i|). Reported as max, mean and variance over the ticks.
- `accumulated_difference`: max over tenants of |W_i(0, t) - W_j(0, t)| at every tick of a fine
  grid (the paper's Figure 3a); Theorem 4.4 bounds it by 2U for tenants backlogged all along.
- `jain_index` over the service rates of backlogged tenants (demand at least 5% above service).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fleetwarden.sim.replay import ReplayResult, RequestRecord

BACKLOG_MARGIN = 1.05


@dataclass(frozen=True)
class Prices:
    input: float = 1.0
    output: float = 2.0

    def cost(self, record: RequestRecord) -> float:
        return self.input * record.trace.input_tokens + self.output * record.output_tokens

    def demand(self, record: RequestRecord) -> float:
        return self.input * record.trace.input_tokens + self.output * record.trace.output_tokens


def tenants_of(records: Iterable[RequestRecord]) -> list[str]:
    return sorted({r.trace.tenant for r in records})


def service_between(
    records: Iterable[RequestRecord], start: float, end: float, end_of_run: float, prices: Prices
) -> dict[str, float]:
    """Service each tenant received in [start, end), spread uniformly over each request's life."""
    totals: dict[str, float] = {}
    for record in records:
        if record.first_token_s is None:
            continue
        first = record.first_token_s
        last = record.completion_s if record.completion_s is not None else end_of_run
        cost = prices.cost(record)
        if last <= first:
            share = cost if start <= first < end else 0.0
        else:
            overlap = max(0.0, min(end, last) - max(start, first))
            share = cost * overlap / (last - first)
        if share:
            totals[record.trace.tenant] = totals.get(record.trace.tenant, 0.0) + share
    return totals


def demand_between(
    records: Iterable[RequestRecord], start: float, end: float, prices: Prices
) -> dict[str, float]:
    """Cost of the requests each tenant sent in [start, end), throttled ones included."""
    totals: dict[str, float] = {}
    for record in records:
        if start <= record.trace.arrival_s < end:
            tenant = record.trace.tenant
            totals[tenant] = totals.get(tenant, 0.0) + prices.demand(record)
    return totals


def jain_index(values: Sequence[float]) -> float:
    """(sum x)^2 / (n * sum x^2); 1.0 is perfectly even, 1/n is one taking all."""
    if not values:
        return 1.0
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else sum(values) ** 2 / (len(values) * squares)


@dataclass(frozen=True)
class Summary:
    max: float
    mean: float
    variance: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if not values:
            return cls(0.0, 0.0, 0.0)
        return cls(max(values), statistics.fmean(values), statistics.pvariance(values))


def tick_centres(
    duration_s: float, warmup_s: float, half_window_s: float, ticks: int
) -> list[float]:
    first, last = warmup_s + half_window_s, duration_s - half_window_s
    if ticks <= 1 or last <= first:
        return [max(first, min(last, (first + last) / 2))]
    step = (last - first) / (ticks - 1)
    return [first + i * step for i in range(ticks)]


def service_difference(
    result: ReplayResult,
    duration_s: float,
    *,
    warmup_s: float = 30.0,
    half_window_s: float = 30.0,
    ticks: int = 19,
    prices: Prices | None = None,
) -> Summary:
    """The VTC paper's service difference (see the module docstring)."""
    prices = prices or Prices()
    tenants = tenants_of(result.records)
    values = []
    for centre in tick_centres(duration_s, warmup_s, half_window_s, ticks):
        start, end = centre - half_window_s, centre + half_window_s
        width = end - start
        service = service_between(result.records, start, end, result.end_s, prices)
        demand = demand_between(result.records, start, end, prices)
        rates = {t: service.get(t, 0.0) / width for t in tenants}
        top = max(rates.values(), default=0.0)
        values.append(
            sum(min(top - rates[t], abs(demand.get(t, 0.0) / width - rates[t])) for t in tenants)
        )
    return Summary.of(values)


def accumulated_difference(
    result: ReplayResult,
    duration_s: float,
    tenants: Sequence[str] | None = None,
    *,
    step_s: float = 5.0,
    prices: Prices | None = None,
) -> list[float]:
    """max_ij |W_i(0, t) - W_j(0, t)| over `tenants` at t = step, 2 step, ..., duration."""
    prices = prices or Prices()
    chosen = list(tenants) if tenants is not None else tenants_of(result.records)
    series = []
    t = step_s
    while t <= duration_s + 1e-9:
        service = service_between(result.records, 0.0, t, result.end_s, prices)
        values = [service.get(name, 0.0) for name in chosen]
        series.append(max(values) - min(values) if values else 0.0)
        t += step_s
    return series


def backlogged_service_rates(
    result: ReplayResult, start: float, end: float, prices: Prices | None = None
) -> dict[str, float]:
    """Service rates in [start, end) of the tenants whose demand exceeded their service."""
    prices = prices or Prices()
    service = service_between(result.records, start, end, result.end_s, prices)
    demand = demand_between(result.records, start, end, prices)
    width = end - start
    return {
        t: service.get(t, 0.0) / width
        for t in tenants_of(result.records)
        if demand.get(t, 0.0) >= BACKLOG_MARGIN * service.get(t, 0.0)
    }
