"""An `engine_metrics` utilisation source pointed at a serving Service reads the sidecar.

Both ports of the Service the operator builds (`http` and `metrics`) reach the sidecar, whose
/metrics has no `vllm:` gauges, only its copy of the engine's reading,
`fleetwarden_kv_cache_utilization`. Reading only the vLLM names, the source answered None there
for ever, and the documented example target (docs/batch.md) never released any work. The
sidecar leaves the sample out while its engine loads or its reading is stale, which must stay
None (unknown), never a 0.0 that reads as an idle engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from fleetwarden.batch.utilisation import EngineMetricsSource, kv_cache_usage
from fleetwarden.fairness.config import GateConfig
from fleetwarden.metrics import names
from tests.support.sidecar_stack import SidecarHandle, fairness_config, running_sidecar, serve

#: Telemetry older than this is stale: the sidecar then drops its KV sample.
MAX_AGE_S = 0.4


@dataclass
class Engine:
    """An engine's `/metrics`: 503 while `loading` (its API server is not up yet), else vLLM's
    KV-cache gauge at `kv`."""

    loading: bool = True
    kv: float = 0.42

    async def metrics(self, request: web.Request) -> web.Response:
        if self.loading:
            return web.Response(status=503, text="loading")
        lines = [
            f'{names.VLLM_NUM_REQUESTS_WAITING}{{model_name="m"}} 0',
            f'{names.VLLM_KV_CACHE_USAGE}{{model_name="m"}} {self.kv}',
        ]
        return web.Response(text="\n".join(lines) + "\n")


@dataclass
class Stack:
    engine: Engine
    sidecar: SidecarHandle
    http: aiohttp.ClientSession

    def source(self) -> EngineMetricsSource:
        """The batch service's source for a target whose URL is the sidecar's /metrics."""
        return EngineMetricsSource(self.http, f"{self.sidecar.url}/metrics", timeout_s=2.0)

    async def sidecar_page(self) -> str:
        async with self.http.get(f"{self.sidecar.url}/metrics") as response:
            assert response.status == 200
            return await response.text()


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    engine = Engine()
    app = web.Application()
    app.router.add_get("/metrics", engine.metrics)
    gate = GateConfig(
        max_inflight_tokens=None, max_waiting_requests=0, telemetry_max_age_s=MAX_AGE_S
    )
    async with (
        serve(app) as served,
        running_sidecar(served.url, fairness_config(gate=gate)) as sidecar,
        aiohttp.ClientSession() as http,
    ):
        yield Stack(engine, sidecar, http)


async def until(probe: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    """Return once `await probe()` is true; fail the test after `timeout_s` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await probe():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not reached in {timeout_s:g} s")
        await asyncio.sleep(0.02)


async def test_the_sidecar_page_gives_the_engine_reading(stack: Stack) -> None:
    stack.engine.loading = False
    source = stack.source()

    async def has_sample() -> bool:
        return names.KV_CACHE_UTILIZATION + "{" in await stack.sidecar_page()

    await until(has_sample)
    page = await stack.sidecar_page()
    # The sidecar's own names only: no vLLM gauge on the page the source gets there.
    assert not any(f.name.startswith("vllm") for f in text_string_to_metric_families(page))
    assert kv_cache_usage(page) == pytest.approx(0.42)
    assert await source.utilisation() == pytest.approx(0.42)


async def test_loading_and_stale_engines_read_as_unknown(stack: Stack) -> None:
    source = stack.source()
    # Loading: the sidecar has polled the engine and been refused; the family is declared with
    # no sample, which is no reading at all.
    assert stack.sidecar.state.telemetry is not None
    assert stack.sidecar.state.telemetry.last_error is not None
    page = await stack.sidecar_page()
    assert f"# TYPE {names.KV_CACHE_UTILIZATION} gauge" in page
    assert await source.utilisation() is None

    stack.engine.loading = False

    async def known() -> bool:
        return await source.utilisation() is not None

    await until(known)
    assert await source.utilisation() == pytest.approx(0.42)

    # Silent past the bound: the sidecar drops its stale sample and the source says unknown.
    stack.engine.loading = True

    async def unknown() -> bool:
        return await source.utilisation() is None

    await until(unknown)
    await asyncio.sleep(2 * MAX_AGE_S)
    assert await source.utilisation() is None


async def test_the_engines_own_gauge_wins_over_the_sidecars(stack: Stack) -> None:
    """A page with both (e.g. a scrape proxy merging pod metrics) reads the engine's gauge."""
    stack.engine.loading, stack.engine.kv = False, 0.3

    async def has_sample() -> bool:
        return kv_cache_usage(await stack.sidecar_page()) is not None

    await until(has_sample)
    page = await stack.sidecar_page()
    assert kv_cache_usage(page) == pytest.approx(0.3)  # the sidecar's copy alone
    engine_line = f'{names.VLLM_KV_CACHE_USAGE}{{model_name="m"}} 0.9\n'
    for line in (engine_line, engine_line.replace(":", "_")):
        assert kv_cache_usage(page + line) == pytest.approx(0.9)
        assert kv_cache_usage(line + page) == pytest.approx(0.9)
