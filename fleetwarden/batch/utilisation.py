"""Capacity signals: the utilisation of one (model, region), read from Prometheus or an engine.

A source answers None when it cannot tell (unreachable, no series); the release rule then
releases nothing, which is the safe side: the work is durable and gets promoted if it waits
too long.
"""

from __future__ import annotations

import asyncio
import logging
import math
from string import Template
from typing import Any, Protocol

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from fleetwarden.metrics.names import KV_CACHE_UTILIZATION, VLLM_KV_CACHE_NAMES, exposition_name

log = logging.getLogger(__name__)


class UtilisationSource(Protocol):
    """Effective memory (KV-cache) utilisation in [0, 1], or None when unknown."""

    async def utilisation(self) -> float | None: ...


class FixedUtilisation:
    """A value set by hand: tests, benchmarks, and targets with an external controller."""

    def __init__(self, value: float | None = None) -> None:
        self.value = value

    async def utilisation(self) -> float | None:
        return self.value


#: The KV-cache gauges `kv_cache_usage` reads, in preference order: the engine's own (vLLM),
#: then the sidecar's copy of it. A serving Service's ports both reach the sidecar, whose
#: /metrics has only the latter, so a target's `engine_metrics` URL may point at either.
KV_CACHE_SOURCES: tuple[str, ...] = (*VLLM_KV_CACHE_NAMES, KV_CACHE_UTILIZATION)


def kv_cache_usage(exposition: str) -> float | None:
    """KV-cache usage from a /metrics page: the mean over the series of the first gauge present.

    `vllm:kv_cache_usage_perc` is preferred, then the older `vllm:gpu_cache_usage_perc` (each
    also under its underscore spelling), then the sidecar's `fleetwarden_kv_cache_utilization`,
    so a URL on the sidecar (the serving Service) reads the engine's value as the sidecar last
    polled it. The sidecar leaves its sample out while the engine loads or its reading is stale:
    no sample of any of these is None (unknown), never 0.0, which would read as an idle engine.
    """
    found: dict[str, list[float]] = {}
    wanted = {n: n for n in KV_CACHE_SOURCES} | {exposition_name(n): n for n in KV_CACHE_SOURCES}
    try:
        for family in text_string_to_metric_families(exposition):
            name = wanted.get(family.name)
            if name is None:
                continue
            for sample in family.samples:
                if sample.name == family.name and math.isfinite(sample.value):
                    found.setdefault(name, []).append(sample.value)
    except ValueError as exc:
        log.warning("unparseable engine metrics: %s", exc)
        return None
    for name in KV_CACHE_SOURCES:
        values = found.get(name)
        if values:
            return min(1.0, max(0.0, sum(values) / len(values)))
    return None


class EngineMetricsSource:
    """Reads an engine's or a sidecar's /metrics page directly.

    Through a Service URL each request reaches one pod of several, so the reading is that pod's
    alone; Prometheus (`PrometheusSource`) averages a region with several pods.
    """

    def __init__(self, session: aiohttp.ClientSession, url: str, timeout_s: float) -> None:
        self._session = session
        self._url = url
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def utilisation(self) -> float | None:
        try:
            async with self._session.get(self._url, timeout=self._timeout) as response:
                if response.status != 200:
                    return None
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("metrics %s unreachable: %s", self._url, exc)
            return None
        return kv_cache_usage(text)


def query_params(timeout_s: float) -> dict[str, str]:
    """Query parameters for Prometheus: its server-side `timeout`, as bare float seconds.

    Prometheus reads a duration parameter as float seconds first, then as a duration with units,
    and units take whole numbers only: `5.0s` (what formatting a float with an `s` gives, and
    the config's default is the float 5.0) is refused with HTTP 400, so every query failed and
    no NIW work was released on shared regions. `fleetwarden.metrics.client` sends the same
    form.
    """
    return {"timeout": repr(float(timeout_s))}


class PrometheusSource:
    """Runs the planner's utilisation query for one (model, region) against Prometheus.

    The query is a template: `$model` and `$region` are substituted (PromQL uses braces, so
    `str.format` placeholders would clash). Several series answer with their maximum: release
    work only when every series says there is room.
    """

    def __init__(
        self, url: str, query_template: str, model: str, region: str, timeout_s: float
    ) -> None:
        self._url = url
        self._query = Template(query_template).safe_substitute(model=model, region=region)
        self._timeout_s = timeout_s
        self._client: Any = None

    @property
    def query(self) -> str:
        return self._query

    def _run(self) -> float | None:
        from prometheus_api_client.exceptions import PrometheusApiClientException
        from prometheus_api_client.prometheus_connect import PrometheusConnect
        from urllib3.util.retry import Retry

        try:
            if self._client is None:
                # No client-side retries: the next signal is the retry, and a slow answer here
                # would only delay it.
                self._client = PrometheusConnect(
                    url=self._url, retry=Retry(total=0), timeout=math.ceil(self._timeout_s)
                )
            result = self._client.custom_query(self._query, params=query_params(self._timeout_s))
        except (PrometheusApiClientException, OSError, ValueError) as exc:  # requests: OSError
            log.warning("prometheus query failed: %s", exc)
            return None
        values = [float(series["value"][1]) for series in result if "value" in series]
        values = [v for v in values if math.isfinite(v)]
        return max(values) if values else None

    async def utilisation(self) -> float | None:
        return await asyncio.to_thread(self._run)
