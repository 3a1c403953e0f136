"""What the sidecar makes of the engine's 200s: garbage is an engine error, not a success, and a
stream the client abandons still has its relayed tokens counted, once.

The engines are the stub or small aiohttp apps answering badly on purpose (no GPU here); the
sidecar is the production app on real sockets.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from fleetwarden.fairness.config import TenantConfig
from fleetwarden.fairness.limits import ThrottleReason
from fleetwarden.sim.engine import EngineProfile
from tests.support.eventually import eventually
from tests.support.sidecar_stack import (
    SidecarHandle,
    fairness_config,
    running_sidecar,
    running_stub,
    serve,
)

CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
SLOW = EngineProfile("slow", 100_000, 1, 100_000, 0.0, 0.0, 0.02, 0.0, 0.0)  # 50 tokens/s
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def engine(handler: Handler) -> web.Application:
    """An engine whose completions are `handler`, with the metrics page telemetry reads."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_waiting 0\n")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    app.router.add_get("/metrics", metrics)
    return app


async def samples(sc: SidecarHandle, name: str, tenant: str) -> dict[str, float]:
    """`name`'s samples for `tenant`, keyed by their `kind` or `outcome` label."""
    async with aiohttp.ClientSession() as http, http.get(f"{sc.url}/metrics") as r:
        text = await r.text()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("tenant") == tenant:
                key = sample.labels.get("kind") or sample.labels.get("outcome") or ""
                found[key] = sample.value
    return found


async def test_an_abandoned_stream_counts_its_relayed_tokens_once() -> None:
    """The autoscaler reads `fleetwarden_tokens_total`: the tokens a client received before it
    left are served load. They equal what the scheduler charged (its TPM window holds the same
    input estimate and every relayed output token), so they are counted exactly once."""
    config = fairness_config(
        defaults=TenantConfig(weight=1, tier="iw-n", priority_factor=1, tpm=10**9)
    )
    async with running_stub(SLOW) as stub, running_sidecar(stub.url, config) as sc:
        scheduler = sc.state.dispatcher.scheduler
        async with aiohttp.ClientSession() as http:
            body = {**CHAT, "max_tokens": 1000, "stream": True}
            response = await http.post(
                f"{sc.url}/v1/chat/completions", json=body, headers={"x-fleetwarden-tenant": "a"}
            )
            received = 0
            while received < 10:
                received += (await response.content.readline()).startswith(b"data: {")
            response.close()  # the client goes away mid-stream
            await eventually(lambda: scheduler.running == 0 and not stub.engine.engine.running, 10)
        tokens = await samples(sc, "fleetwarden_tokens_total", "a")
        requests = await samples(sc, "fleetwarden_requests_total", "a")
        charged = scheduler.limiter.usage("a", None, sc.state.dispatcher.clock())
    assert requests == {"cancelled": 1.0}
    assert received - 1 <= tokens["output"] < 1000  # the role-only opening event is no token
    assert tokens["input"] > 0
    assert tokens["input"] + tokens["output"] == charged[ThrottleReason.TENANT_TPM]


async def test_a_non_json_200_is_a_502() -> None:
    async def html(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="<html>oops</html>", content_type="text/html")

    async with serve(engine(html)) as e, running_sidecar(e.url) as sc:
        async with aiohttp.ClientSession() as http:
            headers = {"x-fleetwarden-tenant": "a"}
            async with http.post(f"{sc.url}/v1/chat/completions", json=CHAT, headers=headers) as r:
                assert r.status == 502
                error = (await r.json())["error"]
        assert error["code"] == "engine_error"
        assert "not JSON" in error["message"]
        assert await samples(sc, "fleetwarden_requests_total", "a") == {"engine_error": 1.0}
        assert sc.state.dispatcher.scheduler.running == 0


def streaming(*chunks: bytes) -> Handler:
    """An engine that answers 200 and streams `chunks` as they are, then ends the body."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in chunks:
            await response.write(chunk)
        await response.write_eof()
        return response

    return handler


async def test_a_streamed_200_without_an_event_ends_with_an_error_event() -> None:
    async with (
        serve(engine(streaming(b"Internal meltdown, ", b"not SSE"))) as e,
        running_sidecar(e.url) as sc,
    ):
        async with aiohttp.ClientSession() as http:
            headers = {"x-fleetwarden-tenant": "a"}
            body = {**CHAT, "stream": True}
            async with http.post(f"{sc.url}/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200  # the head went out before the body was known bad
                text = await r.text()
        events = [e.removeprefix("data: ") for e in text.split("\n\n") if e.strip()]
        assert len(events) == 1
        error = json.loads(events[0])["error"]
        assert error["code"] == "engine_error"
        assert "not an event stream" in error["message"]
        assert await samples(sc, "fleetwarden_requests_total", "a") == {"engine_error": 1.0}


async def test_a_stream_of_only_done_is_served() -> None:
    """`data: [DONE]` alone is an event stream, if an empty one: relayed as it is."""
    async with serve(engine(streaming(b"data: [DONE]\n\n"))) as e, running_sidecar(e.url) as sc:
        async with aiohttp.ClientSession() as http:
            headers = {"x-fleetwarden-tenant": "a"}
            body = {**CHAT, "stream": True}
            async with http.post(f"{sc.url}/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200
                assert await r.text() == "data: [DONE]\n\n"
        assert await samples(sc, "fleetwarden_requests_total", "a") == {"served": 1.0}
