"""Read the scaler's inputs from Prometheus: utilisation and tokens/s per (model, region).

Two queries per poll cover the whole fleet (grouped by model and region), so the cost does not
grow with the number of ModelDeployments. Each fresh reading goes into the autoscaler and asks
for a reconcile of the ModelDeployment, which takes the decision. When Prometheus fails, nothing
is written into the signals and the autoscaler holds every region while the polls fail, whatever
the last readings said (fail static, never scale to zero on missing data); the Scaling condition
says why, and polls back off up to a minute.

Load is a `rate()` over `promql.DEFAULT_RATE_WINDOW` (5m), the planner's window too: a window
must hold two scrapes of the counter, and at the chart's 30 s interval one missed scrape empties
a 1m window (at Prometheus' default 60 s every 1m window is nearly always empty). A region whose
load series is missing still scales on utilisation, and its Scaling condition says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetwarden.metrics import names, promql
from fleetwarden.metrics.client import PrometheusClient, PrometheusError, Sample
from fleetwarden.operator import conditions
from fleetwarden.operator.autoscaler import Autoscaler, RegionSignal
from fleetwarden.operator.fleet import FleetView, parse_model_deployment
from fleetwarden.operator.spot_signals import read_backlog

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 60.0


def _by_model_region(samples: list[Sample]) -> dict[tuple[str, str], float]:
    values: dict[tuple[str, str], float] = {}
    for sample in samples:
        model, region = sample.labels.get(names.MODEL), sample.labels.get(names.REGION)
        if model is not None and region is not None:
            values[(model, region)] = sample.value
    return values


@dataclass
class MetricsPoller:
    client: PrometheusClient
    autoscaler: Autoscaler
    view: Callable[[], FleetView]
    request_reconcile: Callable[[str], None]
    interval_s: float = 15.0
    clock: Callable[[], float] = time.time
    rate_window: str = promql.DEFAULT_RATE_WINDOW
    _failures: int = field(default=0, init=False)

    async def poll_once(self) -> bool:
        """One poll; True when Prometheus answered (even with no series)."""
        try:
            utilisation = await asyncio.to_thread(self.client.instant, promql.utilisation())
            load = await asyncio.to_thread(
                self.client.instant, promql.tokens_per_second(window=self.rate_window)
            )
        except PrometheusError as exc:
            self._failures += 1
            message = f"Prometheus query failed ({exc}); replicas hold until it answers"
            self.autoscaler.health = (False, conditions.PROMETHEUS_UNAVAILABLE, message)
            log.warning("%s", message)
            self._request_all()
            return False
        self._failures = 0
        now = self.clock()
        # Before any reconcile is requested below, so each one sizes spot from this poll.
        self.autoscaler.spot.record(await read_backlog(self.client, now, self.rate_window))
        util_by, load_by = _by_model_region(utilisation), _by_model_region(load)
        view = self.view()
        pools = view.valid_pools()
        self.autoscaler.missing = {}
        self.autoscaler.missing_load = {}
        for key, record in view.model_deployments.items():
            spec = parse_model_deployment(record).spec
            if spec is None:
                continue
            for placement in spec.regions:
                pool = pools.get(placement.pool)
                if pool is None:
                    continue
                series = (spec.served_name, pool.region)
                if series not in util_by:
                    self.autoscaler.missing.setdefault(key, []).append(pool.region)
                    continue  # no sidecar or engine reported: no signal, the region holds
                if series not in load_by:
                    self.autoscaler.missing_load.setdefault(key, []).append(pool.region)
                self.autoscaler.signals[(key, placement.pool)] = RegionSignal(
                    now, util_by[series], load_by.get(series)
                )
            self.request_reconcile(key)
        message = "utilisation and load are read from Prometheus"
        self.autoscaler.health = (True, conditions.METRICS_AVAILABLE, message)
        return True

    def _request_all(self) -> None:
        for key in self.view().model_deployments:
            self.request_reconcile(key)

    async def run_forever(self) -> None:
        while True:
            await self.poll_once()
            backoff = min(MAX_BACKOFF_S, self.interval_s * (2 ** min(self._failures, 6)))
            await asyncio.sleep(backoff if self._failures else self.interval_s)
