"""The asyncio side of scheduling: each queued request's handler waits on a future that the
dispatcher resolves when the fair scheduler hands that request to the engine.

All state lives in one `FairScheduler` touched only from the event loop, so there are no locks:
`offer`, `pump`, token events and `release` each run to completion between awaits. `pump` is
called after every event that can open the gate (an arrival, a finished request, fresh engine
telemetry), so a request never waits for a timer tick.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.gate import EngineTelemetry
from fleetwarden.fairness.idle import TenantRetention
from fleetwarden.fairness.request import Request
from fleetwarden.fairness.scheduler import Admission, FairScheduler, QueueLimits
from fleetwarden.sidecar.metrics import SidecarMetrics


class ConfigNotAppliedError(Exception):
    """A valid config the scheduler failed to install. The scheduler installs atomically, so
    the config that was running keeps being enforced; `__cause__` holds what went wrong."""

    def __init__(self, running_version: str, cause: Exception) -> None:
        detail = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
        super().__init__(
            f"the fairness config could not be applied ({detail}); "
            f"the running config (version {running_version}) is unchanged"
        )
        self.running_version = running_version


class Dispatcher:
    """Futures for queued requests, and the loop-side wrapper around the scheduler."""

    def __init__(
        self,
        config: FairnessConfig,
        metrics: SidecarMetrics,
        *,
        queue_limits: QueueLimits,
        retention: TenantRetention | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.scheduler = FairScheduler(
            config, queue_limits=queue_limits, retention=retention, now=clock()
        )
        self.metrics = metrics
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._next_seq = 0
        self.dispatch_log: list[int] | None = None
        """When a list, the seq of every dispatched request is appended (parity tests)."""
        metrics.set_config_version(self.scheduler.version)
        metrics.name_known(config.tenants, config.applications)

    def next_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq

    @property
    def config(self) -> FairnessConfig:
        return self.scheduler.config

    def offer(self, request: Request) -> Admission:
        """Queue the request (and try to dispatch at once) or return the refusal."""
        admission = self.scheduler.offer(request, self.clock())
        if admission.queued:
            self._waiters[request.seq] = asyncio.get_running_loop().create_future()
            self.pump()
        return admission

    async def wait_turn(self, request: Request, timeout_s: float) -> bool:
        """Wait until dispatched; False when `timeout_s` passed first (the request is dropped)."""
        waiter = self._waiters.get(request.seq)
        if waiter is None:
            return True  # dispatched inside offer()
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except TimeoutError:
            self.release(request)
            return False
        return True

    def pump(self) -> None:
        """Dispatch every request the gate admits now and wake their handlers."""
        now = self.clock()
        for request in self.scheduler.dispatch_ready(now):
            waiter = self._waiters.pop(request.seq, None)
            if self.dispatch_log is not None:
                self.dispatch_log.append(request.seq)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        self.metrics.queue_depth_now.set(self.scheduler.queued)
        self.metrics.in_flight_now.set(self.scheduler.running)

    def release(self, request: Request) -> None:
        """The handler is done with `request`, however it ended: settle it and refill the engine."""
        waiter = self._waiters.pop(request.seq, None)
        if waiter is not None and not waiter.done():
            waiter.cancel()
        self.scheduler.cancel(request, self.clock())
        self.pump()

    def observe_engine(self, telemetry: EngineTelemetry) -> None:
        self.scheduler.observe_engine(telemetry)
        if telemetry.kv_utilization is not None:
            self.metrics.kv_now.set(telemetry.kv_utilization)
        self.pump()

    def reconfigure(self, config: FairnessConfig) -> bool:
        """Apply `config`; ConfigNotAppliedError when the scheduler could not (nothing changed)."""
        running_version = self.scheduler.version
        try:
            changed = self.scheduler.reconfigure(config, self.clock())
        except Exception as exc:  # any failure: the scheduler is left exactly as it was
            raise ConfigNotAppliedError(running_version, exc) from exc
        if changed:
            self.metrics.set_config_version(self.scheduler.version)
            self.metrics.name_known(config.tenants, config.applications)
            self.pump()
        return changed
