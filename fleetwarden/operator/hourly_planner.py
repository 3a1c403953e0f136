"""The operator's hourly plan: read history from Prometheus, run the pure round, hand over targets.

One planner for the whole fleet, not one timer per ModelDeployment, because RegionPools are
shared across models: the integer program's pool-capacity rows couple every model placed in a
pool, so planning models one by one would let the first one planned take a shared pool's GPUs
that a cheaper fleet-wide plan gives to another (or overcommit it). One round also means one
Prometheus range query per (history, step) setting for the whole fleet instead of one per model.

At start-up and at every period boundary (the shortest `scaling.forecast.horizonSeconds` of the
fleet, 3600 s by default, aligned to the clock so restarts do not shift the plan hour), and as
soon as a ModelDeployment or RegionPool is added, removed or edited (a new model should not
wait up to an hour for its first plan), it:

1. reads `historyDays` of tokens/s per (model, region) (the PromQL of `metrics.promql`) and the
   last hour of NIW tokens/s for SageServe's beta buffer;
2. runs `forecasting.hourly.plan_round` in a thread of its own (ARIMA fits are CPU-bound and
   would stall the event loop; the executor is the planner's, nothing process-wide is set);
3. fills `Autoscaler.plans` (target and forecast peak per endpoint, which the scalers move
   toward) and the `PlanBook` the reconcile turns into status, conditions and an Event;
4. asks for a reconcile of every ModelDeployment.

Failures keep the previous plan in force (fail static): Prometheus unreachable, or the round
failing, sets `Planned=False` on every ModelDeployment with the reason and retries with
exponential backoff (never later than the next boundary). A (model, region) with no history
holds its replicas (the round's rule); a ModelDeployment whose spec or pools are invalid is left
out, its replicas held and the capacity they use reserved in the pools. Its previous plan is
dropped at once, whatever the round's outcome: a target sized for a spec that no longer holds
must not keep driving its scalers (without a plan they hold, as for a region without history).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec
from fleetwarden.forecasting.forecast import DEFAULT_CONFIG, ForecastConfig
from fleetwarden.forecasting.hourly import (
    EndpointHistory,
    FleetPlanError,
    FleetSpecs,
    PoolUsage,
    RoundInput,
    RoundResult,
    plan_round,
)
from fleetwarden.forecasting.planner import PlannerConfig
from fleetwarden.forecasting.series import Series
from fleetwarden.forecasting.warm import WarmForecaster
from fleetwarden.metrics import names, promql
from fleetwarden.metrics.client import PrometheusClient, PrometheusError
from fleetwarden.metrics.client import Series as PromSeries
from fleetwarden.operator.autoscaler import Autoscaler, RegionPlan
from fleetwarden.operator.fleet import FleetView, parse_model_deployment, planned_replicas
from fleetwarden.operator.plan_status import (
    NO_HISTORY,
    NOT_PLANNABLE,
    PLAN_APPLIED,
    PLANNER_FAILED,
    PROMETHEUS_UNAVAILABLE,
    EndpointRecord,
    PlanBook,
    PlanHealth,
)

log = logging.getLogger(__name__)

DEFAULT_PERIOD_S = 3600.0
FIRST_RETRY_S = 5.0
MAX_RETRY_S = 300.0
DAY_S = 86_400.0

History = dict[tuple[str, str], Series]
"""(served model name, region) -> series, as Prometheus labels them."""
HistoryBySetting = dict[tuple[int, int], tuple[History, History]]
"""(historyDays, stepSeconds) -> (interactive, NIW) series."""


@dataclass(frozen=True)
class FleetSnapshot:
    """The plannable part of the fleet, and what the rest occupies."""

    specs: FleetSpecs
    current: dict[tuple[str, str], int]
    reserved: dict[str, PoolUsage]
    skipped: dict[str, str]
    """ModelDeployment key -> why it is left out of the round."""


def snapshot(view: FleetView) -> FleetSnapshot:
    """Split the fleet into what the round can plan and what it must plan around."""
    pools = view.valid_pools()
    specs: dict[str, ModelDeploymentSpec] = {}
    current: dict[tuple[str, str], int] = {}
    reserved: dict[str, PoolUsage] = {}
    skipped: dict[str, str] = {}
    for key, record in sorted(view.model_deployments.items()):
        parsed = parse_model_deployment(record)
        spec = parsed.spec
        if spec is None:
            skipped[key] = parsed.error or "invalid spec"
            continue
        problems = [
            f"pool {p.pool} is missing or invalid"
            if p.pool not in pools
            else f"no throughput for GPU type {pools[p.pool].gpu_type} of pool {p.pool}"
            for p in spec.regions
            if p.pool not in pools or pools[p.pool].gpu_type not in spec.throughput
        ]
        replicas = {p.pool: planned_replicas(record, p) for p in spec.regions}
        if problems:
            skipped[key] = "; ".join(problems)
            for pool, n in replicas.items():
                if pool in pools:
                    before = reserved.get(pool, PoolUsage())
                    gpus = n * spec.model.gpus_per_instance
                    reserved[pool] = PoolUsage(before.instances + n, before.gpus + gpus)
            continue
        specs[key] = spec
        current.update({(key, pool): n for pool, n in replicas.items()})
    return FleetSnapshot(FleetSpecs(pools, specs), current, reserved, skipped)


def period_of(specs: FleetSpecs) -> float:
    """The shortest horizon of the fleet: every model gets a plan at least that often."""
    horizons = [m.scaling.forecast.horizon_seconds for m in specs.model_deployments.values()]
    return float(min(horizons)) if horizons else DEFAULT_PERIOD_S


def next_boundary(now_s: float, period_s: float) -> float:
    """The next multiple of `period_s` after `now_s` (at least a second away)."""
    boundary = math.floor(now_s / period_s) * period_s + period_s
    return boundary if boundary - now_s >= 1.0 else boundary + period_s


def _by_model_region(found: list[PromSeries], step_s: float) -> History:
    out: History = {}
    for series in found:
        model, region = series.labels.get(names.MODEL), series.labels.get(names.REGION)
        if model is not None and region is not None:
            out[(model, region)] = Series.from_points(
                series.timestamps_s, series.values, step_s=step_s
            )
    return out


def read_history(
    client: PrometheusClient,
    fleet: FleetSpecs,
    now_s: float,
    rate_window: str = promql.DEFAULT_RATE_WINDOW,
) -> HistoryBySetting:
    """Tokens/s over each setting's history and NIW tokens/s over the last hour, one query pair
    per (historyDays, stepSeconds) in the fleet. Raises PrometheusError (synchronous: the
    operator runs it in a thread, `fleetwarden plan` calls it directly)."""
    settings = {
        (m.scaling.forecast.history_days, m.scaling.forecast.step_seconds)
        for m in fleet.model_deployments.values()
    }
    out: HistoryBySetting = {}
    for days, step in sorted(settings):
        iw = client.range_series(
            promql.tokens_per_second(window=rate_window), now_s - days * DAY_S, now_s, float(step)
        )
        niw = client.range_series(
            promql.niw_tokens_per_second(window=rate_window), now_s - 3600.0, now_s, float(step)
        )
        out[(days, step)] = (_by_model_region(iw, step), _by_model_region(niw, step))
    return out


@dataclass
class FleetPlanner:
    client: PrometheusClient
    autoscaler: Autoscaler
    book: PlanBook
    view: Callable[[], FleetView]
    request_reconcile: Callable[[str], None]
    clock: Callable[[], float] = time.time
    forecast_base: ForecastConfig = DEFAULT_CONFIG
    planner_config: PlannerConfig | None = None
    rate_window: str = promql.DEFAULT_RATE_WINDOW
    tick_s: float = 5.0
    """How often the loop checks whether a round is due."""
    refit_every_s: float = 0.0
    """Keep each series' ARIMA fit this long and only filter new data with it in between
    (`forecasting.warm`); 0 fits fresh every round. Rounds run one at a time on the planner's
    single thread, so the cache is never used concurrently."""
    last: RoundResult | None = field(default=None, init=False)
    _next_s: float = field(default=-math.inf, init=False)
    _planned_footprint: tuple[object, ...] | None = field(default=None, init=False)
    _failures: int = field(default=0, init=False)
    _executor: ThreadPoolExecutor = field(init=False)
    warm: WarmForecaster | None = field(default=None, init=False)
    """The kept fits when `refit_every_s` > 0 (its `fits` and `reuses` count them)."""

    def __post_init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleetwarden-plan")
        if self.refit_every_s > 0:
            self.warm = WarmForecaster(refit_every_s=self.refit_every_s)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _history(self, fleet: FleetSpecs, now_s: float) -> HistoryBySetting:
        return await asyncio.to_thread(read_history, self.client, fleet, now_s, self.rate_window)

    def _fail(self, keys: list[str], reason: str, message: str) -> bool:
        self._failures += 1
        self.book.outage = PlanHealth(False, reason, message)
        log.warning("hourly plan: %s", message)
        for key in keys:
            self.request_reconcile(key)
        return False

    async def plan_once(self) -> bool:
        """One round; True when a plan was applied (or there was nothing to plan)."""
        view = self.view()
        snap = snapshot(view)
        self._drop_plans(snap.skipped)
        keys = sorted(view.model_deployments)
        now = self.clock()
        if not snap.specs.model_deployments:
            self._failures = 0
            self.book.outage = None
            self._mark_skipped(snap)
            return True
        try:
            history = await self._history(snap.specs, now)
        except PrometheusError as exc:
            message = f"Prometheus query failed ({exc}); the previous plan stays in force"
            return self._fail(keys, PROMETHEUS_UNAVAILABLE, message)
        inputs = RoundInput(
            fleet=snap.specs,
            history=attach_history(snap.specs, history),
            current=snap.current,
            now_s=now,
            reserved=snap.reserved,
        )
        run = functools.partial(
            plan_round,
            inputs,
            forecast_base=self.forecast_base,
            planner_config=self.planner_config,
            warm=self.warm,
        )
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._executor, run)
        except FleetPlanError as exc:
            return self._fail(keys, PLANNER_FAILED, f"{exc}; the previous plan stays in force")
        except Exception as exc:  # a solver crash must not end the planner
            log.exception("hourly plan failed")
            message = f"the planning round failed ({type(exc).__name__}: {exc}); previous plan kept"
            return self._fail(keys, PLANNER_FAILED, message)
        if not result.solved:
            message = f"the solver found no plan (status {result.status}); previous plan kept"
            return self._fail(keys, PLANNER_FAILED, message)
        self._apply(result, self.clock(), period_of(snap.specs))
        self._failures = 0
        self.book.outage = None
        self._mark_skipped(snap)
        for key in keys:
            self.request_reconcile(key)
        return True

    def _apply(self, result: RoundResult, plan_time_s: float, period_s: float) -> None:
        """Hand the round's targets to the autoscaler and the book. Each plan carries the
        planner's period, the interval until the next round, so LT-UA's last window is the end of
        that interval rather than of a fixed hour."""
        self.last = result
        by_model: dict[str, list[str]] = {}
        regions_of: dict[str, set[str]] = {}
        for key, e in sorted(result.endpoints.items()):
            if e.held:
                self.autoscaler.plans.pop(key, None)  # no data: the scaler holds, as without a plan
            else:
                self.autoscaler.plans[key] = RegionPlan(e.target, e.region_peak_tps, period_s)
            self.book.endpoints[key] = EndpointRecord(
                region=e.region,
                current=e.current,
                target=e.target,
                peak_tps=e.region_peak_tps,
                forecast_model=e.forecast_model,
                healthy=e.healthy,
                fallback_reason=e.fallback_reason,
                held=e.held,
                forecast_time_s=result.now_s,
                plan_time_s=plan_time_s,
            )
            by_model.setdefault(e.model_deployment, []).append(f"{e.pool}={e.target}")
            regions_of.setdefault(e.model_deployment, set()).add(e.region)
        solver = f"solver {result.status}" + (
            "" if result.gap is None else f", gap {100 * result.gap:.2f}%"
        )
        # Grouped once: looking each ModelDeployment up in all endpoints and forecasts would make
        # a round's apply quadratic in the fleet's size.
        held_of = result.held_regions_by_model()
        for md, targets in by_model.items():
            held = held_of.get(md, [])
            if held and len(held) == len(regions_of[md]):
                message = f"no tokens/s history in Prometheus for {', '.join(held)}; replicas hold"
                self.book.health[md] = PlanHealth(False, NO_HISTORY, message)
                continue
            message = f"targets {', '.join(targets)} ({solver})"
            if held:
                message += f"; no history for {', '.join(held)}: those hold their replicas"
            self.book.health[md] = PlanHealth(True, PLAN_APPLIED, message)

    def _drop_plans(self, skipped: dict[str, str]) -> None:
        """Forget the last plan of every left-out ModelDeployment: its scalers stop moving toward
        it and its status stops showing it (the `Planned` condition says why)."""
        for key in [k for k in self.autoscaler.plans if k[0] in skipped]:
            del self.autoscaler.plans[key]
        for key in [k for k in self.book.endpoints if k[0] in skipped]:
            del self.book.endpoints[key]

    def _mark_skipped(self, snap: FleetSnapshot) -> None:
        for key, why in snap.skipped.items():
            message = f"left out of the fleet plan, replicas hold: {why}"
            self.book.health[key] = PlanHealth(False, NOT_PLANNABLE, message)
            self.request_reconcile(key)

    def retry_delay_s(self, now_s: float, period_s: float) -> float:
        """After a success the next boundary; after failures exponential backoff, capped there."""
        until_boundary = next_boundary(now_s, period_s) - now_s
        if not self._failures:
            return until_boundary
        backoff = min(MAX_RETRY_S, FIRST_RETRY_S * 2.0 ** (self._failures - 1))
        return min(backoff, until_boundary)

    def _due(self, view: FleetView, now_s: float) -> bool:
        """At the boundary or retry time; or, when not failing, as soon as the fleet changed (a
        new ModelDeployment or an edited spec or pool should not wait up to an hour)."""
        if now_s >= self._next_s:
            return True
        return not self._failures and _footprint(view) != self._planned_footprint

    async def run_forever(self) -> None:
        try:
            while True:
                view = self.view()
                if self._due(view, self.clock()):
                    footprint = _footprint(view)
                    if await self.plan_once():
                        self._planned_footprint = footprint
                    now = self.clock()
                    self._next_s = now + self.retry_delay_s(now, period_of(snapshot(view).specs))
                await asyncio.sleep(self.tick_s)
        finally:
            self.close()


def _footprint(view: FleetView) -> tuple[object, ...]:
    """What a plan depends on besides history: every object's identity and spec generation."""
    return tuple(
        sorted(
            (kind, key, r.generation)
            for kind, table in (("md", view.model_deployments), ("pool", view.pools))
            for key, r in table.items()
        )
    )


def attach_history(
    fleet: FleetSpecs, history: HistoryBySetting
) -> dict[tuple[str, str], EndpointHistory]:
    """Prometheus holds one series per (served model, region); the round sums endpoints of a
    region, so each region's series goes to the first of the model's pools in that region."""
    out: dict[tuple[str, str], EndpointHistory] = {}
    for key, spec in fleet.model_deployments.items():
        settings = spec.scaling.forecast
        iw, niw = history[(settings.history_days, settings.step_seconds)]
        seen: set[str] = set()
        for placement in spec.regions:
            region = fleet.pools[placement.pool].region
            if region in seen:
                continue
            seen.add(region)
            series = iw.get((spec.served_name, region))
            if series is not None:
                out[(key, placement.pool)] = EndpointHistory(
                    series, niw.get((spec.served_name, region))
                )
    return out
