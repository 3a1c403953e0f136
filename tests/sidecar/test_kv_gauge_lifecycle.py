"""`fleetwarden_kv_cache_utilization` has a sample only while the sidecar holds a fresh engine
reading: none while the engine loads its model, none once its telemetry is stale.

Prometheus scrapes not-ready pods too (endpoint discovery), so a loading pod that exported 0.0
was averaged into `promql.utilisation()` as an idle instance: the scaler then held where it had
to add, removed where it had to hold, and the batch service released NIW onto hot pods (review
r07). `/readyz` and `GET /admin/state` keep their meaning.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from fleetwarden.fairness.config import GateConfig
from fleetwarden.metrics import names
from fleetwarden.sidecar.metrics import SidecarMetrics
from tests.support.sidecar_stack import fairness_config, running_sidecar, serve


def kv_samples(exposition: str) -> list[tuple[dict[str, str], float]]:
    """The samples of the KV gauge in an exposition (the HELP and TYPE lines are not samples)."""
    return [
        (dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(exposition)
        if family.name == names.KV_CACHE_UTILIZATION
        for sample in family.samples
    ]


def exposition(metrics: SidecarMetrics) -> str:
    return b"".join(metrics.exposition_slices()).decode()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_sample_before_the_first_reading() -> None:
    metrics = SidecarMetrics("m", "r")
    text = exposition(metrics)
    assert f"# TYPE {names.KV_CACHE_UTILIZATION} gauge" in text  # the family is still declared
    assert kv_samples(text) == []
    metrics.kv_now.set(0.37)
    assert kv_samples(exposition(metrics)) == [({"model": "m", "region": "r"}, 0.37)]


def test_a_stale_reading_leaves_the_exposition_and_a_fresh_one_returns() -> None:
    clock, bound = Clock(), [5.0]
    metrics = SidecarMetrics("m", "r")
    metrics.kv_now.expire_with(clock, lambda: bound[0])
    metrics.kv_now.set(0.8)
    clock.now += 5.0  # exactly the bound: still fresh, as for the gate and /readyz
    assert kv_samples(exposition(metrics)) == [({"model": "m", "region": "r"}, 0.8)]
    clock.now += 0.01
    assert kv_samples(exposition(metrics)) == []
    assert metrics.kv_now.value is None
    bound[0] = 60.0  # a config push raising the bound applies at the next scrape
    assert metrics.kv_now.value == 0.8
    clock.now += 100.0
    metrics.kv_now.set(0.1)
    assert kv_samples(exposition(metrics)) == [({"model": "m", "region": "r"}, 0.1)]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_reading_is_no_reading(value: float) -> None:
    metrics = SidecarMetrics("m", "r")
    metrics.kv_now.set(0.5)
    metrics.kv_now.set(value)  # NaN in the exposition would make the region's mean NaN
    assert kv_samples(exposition(metrics)) == []


def test_clear_removes_the_sample() -> None:
    metrics = SidecarMetrics("m", "r")
    metrics.kv_now.set(0.5)
    metrics.kv_now.clear()
    assert kv_samples(exposition(metrics)) == []


# -- through the real sidecar, against an engine that loads, serves and goes silent -------------


@dataclass
class Engine:
    """An engine's `/metrics`: 503 while `loading` (vLLM's API server is not up yet), else the
    gauges; `kv` None leaves the KV gauge out of the answer."""

    loading: bool = True
    kv: float | None = 0.42

    async def metrics(self, request: web.Request) -> web.Response:
        if self.loading:
            return web.Response(status=503, text="loading")
        lines = [f'{names.VLLM_NUM_REQUESTS_WAITING}{{model_name="m"}} 0']
        if self.kv is not None:
            lines.append(f'{names.VLLM_KV_CACHE_USAGE}{{model_name="m"}} {self.kv}')
        return web.Response(text="\n".join(lines) + "\n")


async def until(probe: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    """Return once `await probe()` is true; fail the test after `timeout_s` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await probe():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not reached in {timeout_s:g} s")
        await asyncio.sleep(0.02)


@pytest.fixture
async def engine() -> AsyncIterator[tuple[Engine, str]]:
    fake = Engine()
    app = web.Application()
    app.router.add_get("/metrics", fake.metrics)
    async with serve(app) as served:
        yield fake, served.url


async def test_loading_serving_and_silent_engine(engine: tuple[Engine, str]) -> None:
    fake, engine_url = engine
    max_age = 0.4
    gate = GateConfig(max_inflight_tokens=None, max_waiting_requests=0, telemetry_max_age_s=max_age)
    async with (
        running_sidecar(engine_url, fairness_config(gate=gate)) as sc,
        aiohttp.ClientSession() as http,
    ):

        async def kv() -> list[tuple[dict[str, str], float]]:
            async with http.get(f"{sc.url}/metrics") as response:
                assert response.status == 200
                return kv_samples(await response.text())

        async def ready() -> bool:
            async with http.get(f"{sc.url}/readyz") as response:
                assert response.status in (200, 503)
                return response.status == 200

        async def engine_state() -> Any:
            async with http.get(f"{sc.url}/admin/state", headers=sc.admin_headers) as response:
                assert response.status == 200
                return (await response.json())["engine"]

        # Loading: the engine has been polled and refused; no sample, not ready, no telemetry.
        assert sc.state.telemetry is not None
        assert sc.state.telemetry.last_error is not None
        assert await kv() == []
        assert not await ready()
        assert await engine_state() is None

        # Serving: the engine's reading, ready, the same reading in the admin state.
        fake.loading = False
        expected = [({"model": "stub-model", "region": "local"}, 0.42)]
        await until(lambda: _equals(kv(), expected))
        assert await ready()
        assert (await engine_state())["kvUtilization"] == 0.42

        # Silent: past the bound the sample goes and /readyz says not ready, as it did; the admin
        # state still shows the last reading with its age, as it did.
        fake.loading = True
        await until(lambda: _equals(kv(), []))
        await until(lambda: _not(ready()))
        telemetry = await engine_state()
        assert telemetry["kvUtilization"] == 0.42
        assert telemetry["ageSeconds"] > max_age

        # Answering again without a KV gauge: ready, and still no sample (no KV reading to
        # export; a 0.0 would read as an idle engine).
        fake.loading, fake.kv = False, None
        await until(ready)
        assert await kv() == []
        assert (await engine_state())["kvUtilization"] is None


async def _equals(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


async def _not(value: Awaitable[bool]) -> bool:
    return not await value
