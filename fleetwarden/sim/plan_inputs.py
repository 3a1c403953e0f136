"""What the simulated hourly planner reads, and what a planning round records about itself.

Both fidelities plan the same way (`cluster.FleetSimulation._plan`, `fluid.FluidSimulation._plan`):
each endpoint's tokens/s series over its `historyDays`, from the run's `LoadRecorder` and, for
the time before 0, from the workload's own past (`PriorLoad`, built by `fleetwarden.sim.warmup`).
Production plans from days of Prometheus history; without that past a short run's planner holds
every endpoint in its first round ("no-data") and falls back to last-peak for two days, which is
not what the operator would do.

The past is kept beside the recorder, never in it: only the planner's history reads it, so it
cannot reach LT-UA's observed load, the per-minute samples or any result.

Each round also records which forecast model planned each endpoint (`round_models`), so a report
can say whether the forecaster ran at all (`forecast_model_counts`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fleetwarden.forecasting.series import DAY_S, Series
from fleetwarden.sim.fleet_spec import Model
from fleetwarden.sim.planning import (
    EndpointKey,
    HourlyPlanner,
    LastHourPeakPlanner,
    LoadHistory,
    LoadRecorder,
    PlanEntry,
)
from fleetwarden.sim.workload import Workload, WorkloadInfo

LAST_HOUR_PEAK = "last-hour-peak"
"""The model recorded for `LastHourPeakPlanner`'s plans (it does not forecast)."""
NO_DATA = "no-data"
"""No history: the endpoint was held at its current count (the forecaster's own name for it)."""


@dataclass(frozen=True)
class PriorLoad:
    """Tokens/s per endpoint in `bucket_s` buckets over the `buckets` buckets before time 0
    (oldest first; the last ends at 0): what Prometheus would already hold when the run starts."""

    bucket_s: float
    buckets: int
    iw: Mapping[EndpointKey, tuple[float, ...]]
    """Interactive tokens/s, as `LoadRecorder` records interactive tokens."""
    niw: Mapping[EndpointKey, tuple[float, ...]]
    """NIW tokens/s (the planner's beta buffer reads the last hour of it)."""

    def __post_init__(self) -> None:
        if not self.bucket_s > 0 or self.buckets < 0:
            raise ValueError("bucket_s must be > 0 and buckets >= 0")
        for series in (*self.iw.values(), *self.niw.values()):
            if len(series) != self.buckets:
                raise ValueError(f"every series needs {self.buckets} buckets, got {len(series)}")

    @property
    def days(self) -> float:
        return self.buckets * self.bucket_s / DAY_S

    def step_means(self, key: EndpointKey, first: int, per_step: int, *, niw: bool) -> list[float]:
        """Mean tokens/s of each `per_step` buckets from bucket `first` (< 0, relative to time 0)
        up to time 0; an endpoint without a series is idle (0), as the recorder has it."""
        series = (self.niw if niw else self.iw).get(key)
        offset = self.buckets + first
        if offset < 0:
            raise ValueError(f"the warm-up holds {self.buckets} buckets, not {-first}")
        out = []
        for start in range(offset, self.buckets, per_step):
            chunk = series[start : start + per_step] if series is not None else ()
            out.append(sum(chunk) / per_step)
        return out


class WarmedWorkload(Workload):
    """A built workload that also knows its own past (`PriorLoad`), computed once per bucket size
    when a run first plans (building a workload for its description costs nothing more)."""

    def __init__(
        self, base: Workload, info: WorkloadInfo, prior: Callable[[float], PriorLoad | None]
    ) -> None:
        super().__init__(info, lambda: iter(base))
        self._make_prior = prior
        self._priors: dict[float, PriorLoad | None] = {}

    def prior(self, bucket_s: float) -> PriorLoad | None:
        if bucket_s not in self._priors:
            self._priors[bucket_s] = self._make_prior(bucket_s)
        return self._priors[bucket_s]


def workload_prior(workload: object, bucket_s: float) -> PriorLoad | None:
    """The past of a `WarmedWorkload`; None for any other request stream (no warm-up)."""
    return workload.prior(bucket_s) if isinstance(workload, WarmedWorkload) else None


def warm_history(
    load: LoadRecorder,
    prior: PriorLoad | None,
    key: EndpointKey,
    now: float,
    step_s: float,
    days: float,
) -> LoadHistory:
    """`load.history(...)` with the part of the window before time 0 taken from `prior`, on the
    same step grid (steps are whole buckets counted from time 0, as the recorder counts them)."""
    recent = load.history(key, now, step_s, days)
    if prior is None:
        return recent
    if prior.bucket_s != load.bucket_s:
        raise ValueError(f"warm-up buckets of {prior.bucket_s} s, recorder's {load.bucket_s} s")
    bucket = load.bucket_s
    per_step = max(1, round(step_s / bucket))
    end = int(now // bucket) // per_step * per_step
    start = end - int(days * DAY_S / bucket) // per_step * per_step
    first = max(start, -(prior.buckets // per_step) * per_step)
    if first >= 0 or recent.iw_tps.start_s != 0.0:
        return recent
    merged = [
        Series(
            first * bucket,
            per_step * bucket,
            (*prior.step_means(key, first, per_step, niw=niw), *series.values),
        )
        for series, niw in ((recent.iw_tps, False), (recent.niw_tps, True))
    ]
    return LoadHistory(merged[0], merged[1])


class _Planned(Protocol):
    @property
    def model(self) -> Model: ...


def plan_histories(
    load: LoadRecorder, prior: PriorLoad | None, endpoints: Mapping[EndpointKey, _Planned], t: float
) -> dict[EndpointKey, LoadHistory]:
    """Every endpoint's history over its ModelDeployment's `historyDays` at `stepSeconds`."""
    history = {}
    for key, endpoint in endpoints.items():
        forecast = endpoint.model.spec.scaling.forecast
        history[key] = warm_history(
            load, prior, key, t, float(forecast.step_seconds), forecast.history_days
        )
    return history


def round_models(
    planner: HourlyPlanner, now: float, plans: Mapping[EndpointKey, PlanEntry]
) -> dict[EndpointKey, str | None]:
    """Which model planned each endpoint this round: the forecaster's own name (`arima`,
    `seasonal-naive`, `last-peak`, `no-data`) from a planner that keeps its last round
    (`ForecastPlanner.last`), `last-hour-peak` or `no-data` for `LastHourPeakPlanner`, None for a
    planner that says nothing about it."""
    last: Any = getattr(planner, "last", None)
    endpoints = getattr(last, "endpoints", None) if getattr(last, "now_s", None) == now else None
    out: dict[EndpointKey, str | None] = {}
    for key, entry in plans.items():
        found = getattr(endpoints.get(key), "forecast_model", None) if endpoints else None
        if isinstance(found, str):
            out[key] = found
        elif isinstance(planner, LastHourPeakPlanner):
            out[key] = NO_DATA if entry.forecast_tps is None else LAST_HOUR_PEAK
        else:
            out[key] = None
    return out


def forecast_model_counts(plans: Mapping[str, Sequence[Sequence[Any]]]) -> dict[str, int]:
    """Plans per forecast model over every endpoint and round of a run's `series.plans` (rows
    `[time, target, forecast_tps, forecast_model]`; rows without a model are left out)."""
    counts: dict[str, int] = {}
    for rows in plans.values():
        for row in rows:
            model = row[3] if len(row) > 3 else None
            if isinstance(model, str):
                counts[model] = counts.get(model, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
