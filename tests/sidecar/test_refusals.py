"""Refusals and failures: 429 with Retry-After, bounded queues, 502/504, client disconnects.

The engine is the stub or a deliberately broken aiohttp app (no GPU here); the sidecar is real.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from fleetwarden.fairness.config import GateConfig, TenantConfig
from fleetwarden.sim.engine import EngineProfile
from tests.support.sidecar_stack import (
    fairness_config,
    free_port,
    running_sidecar,
    running_stub,
    serve,
)

CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
SLOW = EngineProfile("slow", 100_000, 1, 100_000, 0.0, 0.0, 0.05, 0.0, 0.0)  # 20 tokens/s


def assert_openai_error(body: dict[str, object], status_code: str | None = None) -> None:
    error = body["error"]
    assert isinstance(error, dict)
    assert isinstance(error["message"], str)
    assert error["type"]
    if status_code is not None:
        assert error["code"] == status_code


async def test_rpm_limit_is_429_with_retry_after() -> None:
    config = fairness_config(defaults=TenantConfig(weight=1, tier="iw-n", priority_factor=1, rpm=2))
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url, config) as sc:
        async with aiohttp.ClientSession() as http:
            statuses = []
            for _ in range(3):
                async with http.post(f"{sc.url}/v1/chat/completions", json=CHAT) as r:
                    statuses.append(r.status)
                    body = await r.json()
            assert statuses == [200, 200, 429]
            assert_openai_error(body, "rate-limited")
            assert "tenant-rpm" in body["error"]["message"]
            assert 55 <= int(r.headers["Retry-After"]) <= 60
            # another tenant is unaffected
            async with http.post(
                f"{sc.url}/v1/chat/completions", json={**CHAT, "user": "other"}
            ) as r:
                assert r.status == 200


async def test_a_prompt_over_the_whole_tpm_limit_is_a_400_not_a_429() -> None:
    """A 429 with Retry-After would have the client retry forever: the request never fits."""
    config = fairness_config(
        defaults=TenantConfig(weight=1, tier="iw-n", priority_factor=1, tpm=1000)
    )
    big = {**CHAT, "messages": [{"role": "user", "content": "word " * 2000}]}
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url, config) as sc:
        async with aiohttp.ClientSession() as http:
            headers = {"x-fleetwarden-tenant": "a"}
            async with http.post(f"{sc.url}/v1/chat/completions", json=big, headers=headers) as r:
                assert r.status == 400
                assert "Retry-After" not in r.headers
                body = await r.json()
            assert_openai_error(body, "request-exceeds-tpm-limit")
            assert body["error"]["param"] == "tenant-tpm"
            assert "1000 tokens per minute" in body["error"]["message"]
            async with http.post(f"{sc.url}/v1/chat/completions", json=CHAT, headers=headers) as r:
                assert r.status == 200  # the refusal used no quota
            async with http.get(f"{sc.url}/metrics") as r:
                text = await r.text()
    assert 'outcome="invalid",region="local",tenant="a"' in text
    assert stub.engine.requests_total == 1


async def test_tenant_queue_bound_refuses_the_overflow_only() -> None:
    gate = GateConfig(max_inflight_tokens=1, max_waiting_requests=0, telemetry_max_age_s=5)
    async with (
        running_stub(SLOW) as stub,
        running_sidecar(stub.url, fairness_config(gate=gate), queue_per_tenant=2) as sc,
    ):
        async with aiohttp.ClientSession() as http:
            body = {**CHAT, "max_tokens": 4}

            async def call(tenant: str) -> int:
                headers = {"x-fleetwarden-tenant": tenant}
                async with http.post(
                    f"{sc.url}/v1/chat/completions", json=body, headers=headers
                ) as r:
                    await r.read()
                    return r.status

            first = asyncio.create_task(call("a"))  # dispatched; the gate now holds the rest
            await asyncio.sleep(0.05)
            queued = [asyncio.create_task(call("a")) for _ in range(2)]
            await asyncio.sleep(0.05)
            assert await call("a") == 429  # a's queue holds 2
            other = asyncio.create_task(call("b"))
            assert sorted(await asyncio.gather(first, *queued, other)) == [200, 200, 200, 200]


async def test_engine_down_is_502_and_engine_hang_is_504() -> None:
    async with running_sidecar(f"http://127.0.0.1:{free_port()}") as sc:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{sc.url}/v1/chat/completions", json=CHAT) as r:
                assert r.status == 502
                assert_openai_error(await r.json(), "engine_error")
            async with http.get(f"{sc.url}/readyz") as r:
                assert r.status == 503

    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_waiting 0\n")

    hanging = web.Application()
    hanging.router.add_post("/v1/chat/completions", hang)
    hanging.router.add_get("/metrics", metrics)
    async with (
        serve(hanging) as engine,
        running_sidecar(engine.url, engine_response_timeout_s=0.3) as sc,
    ):
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{sc.url}/v1/chat/completions", json=CHAT) as r:
                assert r.status == 504
                assert_openai_error(await r.json(), "engine_timeout")
        assert sc.state.dispatcher.scheduler.running == 0


async def test_client_disconnect_cancels_upstream_and_settles() -> None:
    async with running_stub(SLOW) as stub, running_sidecar(stub.url) as sc:
        async with aiohttp.ClientSession() as http:
            body = {**CHAT, "max_tokens": 1000, "stream": True}
            response = await http.post(f"{sc.url}/v1/chat/completions", json=body)
            await response.content.readline()
            assert len(stub.engine.engine.running) == 1
            response.close()  # the client goes away mid-stream
            for _ in range(100):
                if not stub.engine.engine.running and sc.state.dispatcher.scheduler.running == 0:
                    break
                await asyncio.sleep(0.02)
            assert stub.engine.engine.running == []
            assert sc.state.dispatcher.scheduler.running == 0


async def test_queued_request_of_a_departed_client_is_dropped() -> None:
    gate = GateConfig(max_inflight_tokens=1, max_waiting_requests=0, telemetry_max_age_s=5)
    async with (
        running_stub(SLOW) as stub,
        running_sidecar(stub.url, fairness_config(gate=gate)) as sc,
        aiohttp.ClientSession() as http,
    ):
        running = asyncio.create_task(
            http.post(f"{sc.url}/v1/chat/completions", json={**CHAT, "max_tokens": 20})
        )
        await asyncio.sleep(0.05)
        waiting = asyncio.create_task(http.post(f"{sc.url}/v1/chat/completions", json=CHAT))
        for _ in range(50):
            if sc.state.dispatcher.scheduler.queued == 1:
                break
            await asyncio.sleep(0.01)
        assert sc.state.dispatcher.scheduler.queued == 1
        waiting.cancel()
        for _ in range(100):
            if sc.state.dispatcher.scheduler.queued == 0:
                break
            await asyncio.sleep(0.01)
        assert sc.state.dispatcher.scheduler.queued == 0
        (await running).close()
    assert stub.engine.requests_total == 1  # the departed request never reached the engine
