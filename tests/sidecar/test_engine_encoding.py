"""The sidecar asks the engine for uncompressed answers and forwards only the headers it means to.

Its engine session does not decompress (the relay handles raw chunks), yet aiohttp's client sends
`Accept-Encoding: gzip, deflate` by itself, and the passthrough forwarded every client header.
An engine that compresses when asked (any server behind a gzip middleware) then had its gzip
bytes relayed without their Content-Encoding (a passthrough answer the client cannot read), or
parsed as JSON (a non-streamed completion: a 502).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web

from fleetwarden.sim.profiles import VTC_A10G
from fleetwarden.sim.stub_engine import StubEngine
from tests.support.sidecar_stack import running_sidecar, serve

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def compressing_engine(seen: list[dict[str, str]]) -> AsyncIterator[str]:
    """The stub engine behind a middleware that compresses every answer the request allows."""
    app = StubEngine(VTC_A10G, model="stub-model", time_scale=0.05).app()

    @web.middleware
    async def compress(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path != "/metrics":
            seen.append({k.lower(): v for k, v in request.headers.items()})
        response = await handler(request)
        if isinstance(response, web.Response):
            response.enable_compression()
        return response

    app.middlewares.append(compress)
    async with serve(app) as served:
        yield served.url


async def test_passthrough_and_unary_answers_arrive_readable() -> None:
    seen: list[dict[str, str]] = []
    async with compressing_engine(seen) as engine, running_sidecar(engine) as sc:
        headers = {"Accept-Encoding": "gzip", "Cookie": "session=secret", "x-custom": "1"}
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{sc.url}/v1/models", headers=headers) as r:
                assert r.status == 200
                models = await r.json()
            body = {"model": "stub-model", "prompt": "hi", "max_tokens": 2}
            async with http.post(f"{sc.url}/v1/completions", json=body, headers=headers) as r:
                assert r.status == 200, await r.text()
                completion = await r.json()
    assert models["data"][0]["id"] == "stub-model"
    assert completion["choices"]
    assert seen
    assert all(h.get("accept-encoding") == "identity" for h in seen), seen
    assert all("cookie" not in h and "x-custom" not in h for h in seen), seen


async def test_telemetry_reads_an_engine_that_compresses_when_asked() -> None:
    """prometheus_client's /metrics app (vLLM's) gzips when the request allows it: the poller
    got gzip bytes, failed every poll, and the gate held the engine to one request at a time."""
    async with compressing_engine([]) as engine, running_sidecar(engine) as sc:
        telemetry = sc.state.telemetry
        assert telemetry is not None
        assert await telemetry.poll_once(), telemetry.last_error
