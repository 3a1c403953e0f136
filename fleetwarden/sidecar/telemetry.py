"""Poll the engine's `/metrics` and feed the reading to the dispatcher.

A failed or unparseable scrape feeds nothing: the last reading ages, and once it is older than the
gate's bound the gate treats the engine as saturated (one request at a time) instead of trusting
stale numbers. Readiness reports whether the engine answered recently.

The sidecar's `fleetwarden_kv_cache_utilization` follows the same bound: it has no sample before
the engine's first KV reading (a pod still loading its model) and none once the last reading is
older than the gate's `telemetry_max_age_s`, so Prometheus never averages a loading or silent pod
in as idle (`SidecarMetrics.kv_utilization`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp

from fleetwarden.fairness.gate import EngineTelemetry
from fleetwarden.sidecar.dispatcher import Dispatcher
from fleetwarden.sidecar.engine_metrics import parse_engine_metrics

log = logging.getLogger(__name__)


class TelemetryPoller:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        engine_url: str,
        dispatcher: Dispatcher,
        *,
        interval_s: float,
        timeout_s: float,
    ) -> None:
        self._session = session
        self._url = engine_url.rstrip("/") + "/metrics"
        self._dispatcher = dispatcher
        self._interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.last_success_s: float | None = None
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None
        # The KV gauge ages by the dispatcher's clock and the gate's bound in force (a config
        # push may change it), exactly as the gate and `healthy` judge the readings.
        dispatcher.metrics.kv_now.expire_with(dispatcher.clock, self._max_age_s)

    def _max_age_s(self) -> float:
        return self._dispatcher.config.gate.telemetry_max_age_s

    async def poll_once(self) -> bool:
        try:
            async with self._session.get(self._url, timeout=self._timeout) as response:
                if response.status != 200:
                    self.last_error = f"engine /metrics answered HTTP {response.status}"
                    return False
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError) as exc:
            self.last_error = f"engine /metrics unreachable: {exc.__class__.__name__}"
            return False
        reading = parse_engine_metrics(text)
        if reading.waiting is None:
            self.last_error = "engine /metrics has no vllm:num_requests_waiting"
            return False
        now = self._dispatcher.clock()
        self._dispatcher.observe_engine(
            EngineTelemetry(now, reading.waiting, reading.kv_utilization)
        )
        self.last_success_s, self.last_error = now, None
        return True

    async def _run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self._interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="fleetwarden-telemetry")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def healthy(self, max_age_s: float) -> bool:
        last = self.last_success_s
        return last is not None and self._dispatcher.clock() - last <= max_age_s
