"""Wiring: one `BatchService` holds the store, the dispatcher, maintenance and the HTTP API.

Startup order matters for durability: the store opens, in-flight items of a previous process
are re-queued (single replica), and only then do the API and the loops start, so nothing is
dispatched twice concurrently and the readiness probe turns green on a consistent store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from fleetwarden.batch.api import BatchApi
from fleetwarden.batch.clock import Clock, SystemClock
from fleetwarden.batch.config import (
    BatchServiceConfig,
    EngineMetricsSourceConfig,
    PrometheusSourceConfig,
    TargetConfig,
)
from fleetwarden.batch.dispatcher import Dispatcher, Target
from fleetwarden.batch.engine import EngineClient, Sender
from fleetwarden.batch.maintenance import Maintenance
from fleetwarden.batch.metrics import BatchMetrics
from fleetwarden.batch.runner import StoreRunner
from fleetwarden.batch.store import BatchStore, open_store
from fleetwarden.batch.utilisation import EngineMetricsSource, PrometheusSource, UtilisationSource

log = logging.getLogger(__name__)


def parse_listen(text: str) -> tuple[str, int]:
    """`host:port` (IPv6 hosts in brackets) as a pair."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen address {text!r} must be host:port")
    return host.strip("[]") or "0.0.0.0", int(port)


@dataclass(frozen=True, slots=True)
class Overrides:
    """What tests and benchmarks replace: the clock, the store, signals, the sender."""

    clock: Clock | None = None
    store: BatchStore | None = None
    sources: Mapping[str, UtilisationSource] | None = None
    """Utilisation source per target name (`model/region/kind`)."""
    sender: Sender | None = None


class BatchService:
    """The running service."""

    def __init__(self, config: BatchServiceConfig, overrides: Overrides | None = None) -> None:
        overrides = overrides or Overrides()
        self.config = config
        self.clock: Clock = overrides.clock or SystemClock()
        self._overrides = overrides
        self.runner = StoreRunner(overrides.store or open_store(config.store))
        self.metrics = BatchMetrics(config.queues(), config.metrics.due_buckets_s)
        self.maintenance = Maintenance(self.runner, config, self.clock, self.metrics)
        self.api = BatchApi(self.runner, config, self.clock, self.maintenance, self.metrics)
        self._session: aiohttp.ClientSession | None = None
        self._site_runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.dispatcher: Dispatcher | None = None
        self.port = 0

    def _source(
        self, target: TargetConfig, session: aiohttp.ClientSession
    ) -> UtilisationSource | None:
        given = (self._overrides.sources or {}).get(target.name)
        if given is not None:
            return given
        spec = target.utilisation
        if isinstance(spec, EngineMetricsSourceConfig):
            return EngineMetricsSource(session, spec.url, spec.timeout_s)
        if isinstance(spec, PrometheusSourceConfig):
            return PrometheusSource(
                spec.url, spec.query, target.model, target.region, spec.timeout_s
            )
        return None

    async def start(self, host: str, port: int, *, loops: bool = True) -> int:
        """Recover, serve the API on host:port (0 picks a port), start the loops; returns the
        port. With `loops=False` only the committer runs and tests drive signals and
        maintenance rounds themselves."""
        store = self.runner.store
        if self.config.single_replica:
            if self.config.store.kind == "redis":
                log.warning(
                    "dispatch.single_replica is true with a Redis store: every lease in the store"
                    " is re-queued at start, so items a live replica is still running are sent"
                    " again; leave it unset (false for Redis) when several replicas share the store"
                )
            requeued = await self.runner.call(store.recover_leases, self.clock.now(), True)
            if requeued:
                log.info("re-queued %d items left in flight by the previous process", requeued)
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        targets = [
            Target(
                t,
                self._source(t, self._session),
                rule=t.release.rule() if t.release is not None else None,
            )
            for t in self.config.targets
        ]
        sender = self._overrides.sender or EngineClient(
            self._session, self.config.dispatch.request_timeout_s
        )
        self.dispatcher = Dispatcher(
            self.runner,
            targets,
            sender,
            self.clock,
            self.config.release.rule(),
            self.config.retry.policy(),
            self.config.dispatch,
            self.metrics,
        )
        self._site_runner = web.AppRunner(self.api.app(), access_log=None)
        await self._site_runner.setup()
        site = web.TCPSite(self._site_runner, host, port)
        await site.start()
        addresses = self._site_runner.addresses
        self.port = int(addresses[0][1]) if addresses else port
        self.dispatcher.start(signal_loops=loops)
        if loops:
            self._tasks.append(asyncio.create_task(self.maintenance.run(), name="batch-maint"))
        self.api.ready = True
        log.info("fleetwarden batch listening on %s:%d", host, self.port)
        return self.port

    async def stop(self) -> None:
        """Stop taking requests, let in-flight items finish within the grace period, close."""
        self.api.ready = False
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.dispatcher is not None:
            await self.dispatcher.stop(self.config.dispatch.shutdown_grace_s)
        if self._site_runner is not None:
            await self._site_runner.cleanup()
        if self._session is not None:
            await self._session.close()
        await asyncio.to_thread(self.runner.close)


async def serve(config: BatchServiceConfig, listen: str | None = None) -> None:
    """Run until SIGTERM or SIGINT."""
    host, port = parse_listen(listen or config.listen)
    service = BatchService(config)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stopped.set)
    await service.start(host, port)
    try:
        await stopped.wait()
    finally:
        await service.stop()
