"""Planner warm-up: the days of load history a run's planner already has at time 0.

Why: the operator plans from days of Prometheus history (`historyDays`, 7 by default). ARIMA is
not tried on less than 2 days (`ForecastConfig.arima_min_history_s`) and seasonal naive needs the
same hour yesterday, so a simulation whose series start empty holds every endpoint in its first
round ("no-data") and plans from the last-peak fallback for two days: a 24-hour run never saw
the forecaster it credits.

What: the workload's own past, from its seeded model, without simulating a request.

- Built-in workload: its rate model (`fluid_rates.BuiltinRates`: the rates the request generator
  draws each 60 s slot from, in the same daily and weekly cycle; bursts are set after time 0 and
  do not reach back) over the `warmup_days` before time 0, per recorder bucket.
- ServeGen: the released per-client rates of the windows before the run's start, as
  `fluid_rates.ServeGenRates` reads them (before the data's first window they wrap around from
  its end, as the regeneration does past its end). Request-level only: a fluid run's rate model
  holds the run's own windows, so a fluid ServeGen run starts with an empty history.
- Trace: replayed from its first request, so it has no earlier part: no warm-up, and the
  workload's notes (shown in the report) say so.

Each bucket's tokens are drawn around the expected rate (`Noise`: a Poisson count of requests of
the stream's mean size, their sizes' spread by a normal approximation), seeded by the workload's
seed. With a noise-free past the forecaster fitted afresh in 27 of the 30 (model, region)
rounds of a 6-hour run, because the run's own noisy hours fit "much worse" than the smooth ones
and its reuse check refused the kept parameters; with the noise, 5 (the first round's), as a
real history keeps them for a day. Each endpoint gets its region's tokens times its pool share,
as the planner splits a region. What the past holds is demand: what the sidecars would have
counted had nothing been throttled or rejected.

How it reaches a run: the workload spec carries it. `with_warmup` turns a spec into the same
spec with a past (`BuiltinWithPast`, `ServeGenWithPast`, `TraceWithPast`: subclasses, so the
fluid rate model and the worker processes read them as the plain spec), whose `build` returns a
`plan_inputs.WarmedWorkload`; the request-level planner reads its past from it, a fluid run from
its `BuiltinRates` (`rates_prior`). Nothing of it enters a figure (`plan_inputs`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from fleetwarden.forecasting.series import DAY_S
from fleetwarden.sim.fleet_spec import Fleet
from fleetwarden.sim.fluid_rates import BuiltinRates, RateModel, ServeGenRates
from fleetwarden.sim.plan_inputs import PriorLoad, WarmedWorkload
from fleetwarden.sim.planning import pool_shares
from fleetwarden.sim.servegen_workload import ServeGenWorkload
from fleetwarden.sim.trace_workload import TraceWorkload
from fleetwarden.sim.workload import LogNormalLength, Workload, WorkloadError
from fleetwarden.sim.workload_builtin import AppProfile, BuiltinWorkload

WARMUP_CAP_DAYS = 7.0
"""The default warm-up is the fleet's longest `historyDays`, at most this: a week is the
production default's whole window; the forecaster's ARIMA needs 2 days, its ARMA errors read the
last 3, and more than 14 would turn on weekly terms no default-configured operator fits."""
MAX_WARMUP_DAYS = 60.0
"""`historyDays`' own upper bound: a longer past could never be read."""
RECORDER_BUCKET_S = 60.0
"""Both simulators record tokens in 60 s buckets (`LoadRecorder`, the fluid step)."""


def default_warmup_days(fleet: Fleet) -> float:
    """The fleet's longest `historyDays`, capped at `WARMUP_CAP_DAYS`."""
    longest = max((m.spec.scaling.forecast.history_days for m in fleet.models.values()), default=0)
    return float(min(WARMUP_CAP_DAYS, longest))


def check_warmup_days(days: float) -> float:
    """`days` as a float, or WorkloadError when it is not a number in [0, 60]."""
    value = float(days)
    if not (math.isfinite(value) and 0 <= value <= MAX_WARMUP_DAYS):
        raise WorkloadError(f"--warmup-days must be within [0, {MAX_WARMUP_DAYS:g}], got {days!r}")
    return value


NOISE_TAG = 0x5741524D
"""Mixed into the workload's seed for the warm-up's draws ("WARM"), so they are seeded by the
workload yet independent of every draw the run itself makes."""
SERVEGEN_SIZE_CV = 1.0
"""Coefficient of variation of a request's prompt plus output tokens assumed for ServeGen's
past (its released length quantiles are per client and window; the built-in workload's is
computed from its applications, about 0.6)."""


@dataclass(frozen=True)
class Noise:
    """How a bucket's tokens are drawn around the rate model's expected tokens/s: a Poisson
    number of requests of the stream's mean size, their total spread by the size's coefficient of
    variation (a normal approximation of the sum), seeded by `seed`."""

    seed: int
    size_cv: float


def size_cv(apps: Mapping[str, AppProfile]) -> float:
    """Coefficient of variation of one built-in request's prompt plus output tokens (lognormal
    moments, the mixture over applications by share; the clip at `cap` is ignored)."""

    def moments(length: LogNormalLength) -> tuple[float, float]:
        mean = length.mean
        return mean, (math.exp(length.sigma**2) - 1) * mean * mean

    total = sum(a.share for a in apps.values())
    mean = second = 0.0
    for app in apps.values():
        (mi, vi), (mo, vo) = moments(app.input), moments(app.output)
        weight = app.share / total
        mean += weight * (mi + mo)
        second += weight * (vi + vo + (mi + mo) ** 2)
    return math.sqrt(max(0.0, second - mean * mean)) / mean if mean > 0 else 0.0


def _draw(
    expected_tps: npt.NDArray[np.float64],
    bucket_s: float,
    mean_tokens: float,
    cv: float,
    rng: np.random.Generator,
) -> npt.NDArray[np.float64]:
    """Tokens/s per bucket drawn around `expected_tps` (see `Noise`)."""
    counts = rng.poisson(np.maximum(expected_tps, 0.0) * bucket_s / mean_tokens)
    spread = np.sqrt(counts) * mean_tokens * cv * rng.standard_normal(len(counts))
    tokens: npt.NDArray[np.float64] = np.maximum(counts * mean_tokens + spread, 0.0)
    return tokens / bucket_s


def rate_prior(
    rates: RateModel,
    fleet: Fleet,
    buckets: int,
    bucket_s: float,
    t0_s: float,
    noise: Noise | None = None,
) -> PriorLoad:
    """`buckets` buckets of `rates` from `t0_s` on, as the past that ends at the run's time 0:
    per endpoint, its pool's share of its region's tokens/s; the expected rates, or drawn
    around them (`noise`), as the run's own series is."""
    expected: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for index in range(buckets):
        start = t0_s + index * bucket_s
        for stream, rate in rates.rates(start, start + bucket_s).items():
            if stream not in expected:
                expected[stream] = ([0.0] * buckets, [0.0] * buckets)
            expected[stream][0][index] = rate.iw
            expected[stream][1][index] = rate.niw
    keys = [(m.key, p.pool) for m in fleet.models.values() for p in m.placements]
    iw = {key: np.zeros(buckets) for key in keys}
    niw = {key: np.zeros(buckets) for key in keys}
    for number, stream in enumerate(sorted(expected)):
        served, region = stream
        model = fleet.model(served)
        shares = pool_shares(model).get(region)
        if shares is None:
            continue
        series = [np.asarray(values, dtype=np.float64) for values in expected[stream]]
        if noise is not None:
            rng = np.random.default_rng([noise.seed, NOISE_TAG, number])
            mean = rates.lengths(served).total
            series = [_draw(values, bucket_s, mean, noise.size_cv, rng) for values in series]
        for pool, share in shares.items():
            iw[model.key, pool] += series[0] * share
            niw[model.key, pool] += series[1] * share
    return PriorLoad(
        bucket_s,
        buckets,
        {key: tuple(values.tolist()) for key, values in iw.items()},
        {key: tuple(values.tolist()) for key, values in niw.items()},
    )


def _buckets(days: float, bucket_s: float) -> int:
    return int(days * DAY_S // bucket_s)


def builtin_prior(
    source: BuiltinWorkload, fleet: Fleet, days: float, bucket_s: float, rates: Any = None
) -> PriorLoad | None:
    """The built-in workload's tokens/s over the `days` before time 0, drawn around its rate
    model (`rates`: that model, when the caller has it)."""
    buckets = _buckets(days, bucket_s)
    if buckets <= 0:
        return None
    model = rates if isinstance(rates, BuiltinRates) else BuiltinRates(source, fleet)
    noise = Noise(source.seed, size_cv(source.apps))
    return rate_prior(model, fleet, buckets, bucket_s, -buckets * bucket_s, noise)


def servegen_prior(
    source: ServeGenWorkload, fleet: Fleet, days: float, bucket_s: float
) -> PriorLoad | None:
    """ServeGen's released rates over the `days` before the run's start (`start_s`), drawn
    around them as `builtin_prior` does."""
    buckets = _buckets(days, bucket_s)
    if buckets <= 0:
        return None
    span = buckets * bucket_s
    earlier = replace(source, start_s=source.start_s - span, duration_s=span)
    noise = Noise(source.seed, SERVEGEN_SIZE_CV)
    return rate_prior(ServeGenRates(earlier, fleet), fleet, buckets, bucket_s, 0.0, noise)


def rates_prior(rates: RateModel, fleet: Fleet, bucket_s: float) -> PriorLoad | None:
    """A fluid run's past: the built-in workload's before time 0, when its spec asks for a
    warm-up; None otherwise (module docstring)."""
    if isinstance(rates, BuiltinRates) and isinstance(rates.workload, BuiltinWithPast):
        workload = rates.workload
        return builtin_prior(workload, fleet, workload.warmup_days, bucket_s, rates)
    return None


OFF_NOTE = (
    "Planner warm-up off (--warmup-days 0): the simulated Prometheus series start empty at time "
    "0, so the first round holds every endpoint at its current count and the forecast planner "
    "falls back to last-peak until the run itself has 2 days of history."
)


def _note(days: float, what: str) -> str:
    return (
        f"Planner warm-up: the simulated Prometheus series start with {days:g} days of {what} "
        "before time 0, as production's planner reads days of history; no request of it is "
        "simulated and none of it enters any figure (fleetwarden.sim.warmup)."
    )


def _with_past(
    base: Workload, days: float, what: str, prior: Callable[[float], PriorLoad | None]
) -> WarmedWorkload:
    """`base` with `days` of `prior` before time 0, described as `what`; off when `days` is 0."""
    if not days:
        return _warmed(base, 0.0, OFF_NOTE, lambda _: None)
    return _warmed(base, days, _note(days, what), prior)


def _warmed(
    base: Workload, days: float, note: str, prior: Callable[[float], PriorLoad | None]
) -> WarmedWorkload:
    info = replace(
        base.info,
        parameters={**base.info.parameters, "warmupDays": days},
        notes=(*base.info.notes, note),
    )
    return WarmedWorkload(base, info, prior)


@dataclass(frozen=True)
class BuiltinWithPast(BuiltinWorkload):
    """The built-in workload with `warmup_days` of its expected load before time 0."""

    warmup_days: float = 0.0

    def build(self, fleet: Fleet) -> Workload:
        days = self.warmup_days
        return _with_past(
            super().build(fleet),
            days,
            "the built-in workload's tokens/s, drawn from its rate model",
            lambda bucket: builtin_prior(self, fleet, days, bucket),
        )


@dataclass(frozen=True)
class ServeGenWithPast(ServeGenWorkload):
    """A ServeGen regeneration with `warmup_days` of the released rates before its start."""

    warmup_days: float = 0.0

    def build(self, fleet: Fleet) -> Workload:
        days = self.warmup_days
        return _with_past(
            super().build(fleet),
            days,
            "tokens/s drawn from ServeGen's released rates of the windows before the run's "
            "start (wrapping around from the data's end before its first window); "
            "request-level only, a fluid run starts with an empty history",
            lambda bucket: servegen_prior(self, fleet, days, bucket),
        )


@dataclass(frozen=True)
class TraceWithPast(TraceWorkload):
    """A trace replay: it starts at the trace's first request, so it has no past to warm up."""

    warmup_days: float = 0.0

    def build(self, fleet: Fleet) -> Workload:
        base = super().build(fleet)
        note = (
            "No planner warm-up: a trace is replayed from its first request, so it has no "
            "earlier part to fill the planner's history with. The first round holds every "
            "endpoint at its current count and the forecast planner falls back to last-peak "
            "until the run itself has 2 days of history."
        )
        return _warmed(base, 0.0, note if self.warmup_days else OFF_NOTE, lambda _: None)


_WITH_PAST: dict[type[Any], type[Any]] = {
    BuiltinWorkload: BuiltinWithPast,
    ServeGenWorkload: ServeGenWithPast,
    TraceWorkload: TraceWithPast,
}


def with_warmup(source: Any, days: float | None, fleet: Fleet) -> Any:
    """`source` (a built-in, ServeGen or trace spec) with `days` of past before time 0 (None: the
    default, `default_warmup_days`; 0: none, and the report says so)."""
    resolved = default_warmup_days(fleet) if days is None else check_warmup_days(days)
    for plain, warm in _WITH_PAST.items():
        if isinstance(source, plain):
            values = {f.name: getattr(source, f.name) for f in fields(plain)}
            return warm(**values, warmup_days=resolved)
    raise WorkloadError(f"no warm-up is defined for a {type(source).__name__} workload")
