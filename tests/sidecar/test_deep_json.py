"""JSON nested deeper than the parser's stack is bad input, not a sidecar crash.

Before the fix a completion body of 100,000 nested arrays made `json.loads` raise RecursionError,
which nothing caught: the client got a 500 "internal error" and the sidecar logged a traceback per
request. The same from the engine (a 200 or 5xx body) was a 500 too, where a body that is not a
usable answer is an engine error (502).
"""

from __future__ import annotations

import logging

import aiohttp
import pytest
from aiohttp import web

from tests.support.sidecar_stack import running_sidecar, running_stub, serve

DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", b'{"model":"m","messages":[{"role":"user","content":"x"}]}'),
        ("/v1/completions", b'{"model":"m","prompt":"x"}'),
    ],
)
async def test_a_deeply_nested_request_is_invalid_json(
    path: str, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    deep = body[:-1] + b',"tools":' + DEEP + b"}"
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        with caplog.at_level(logging.ERROR, logger="fleetwarden"):
            async with aiohttp.ClientSession() as http, http.post(sc.url + path, data=deep) as r:
                assert r.status == 400, await r.text()
                error = (await r.json())["error"]
        assert error["code"] == "invalid_json"
        assert error["type"] == "invalid_request_error"
        assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


@pytest.mark.parametrize("engine_status", [200, 500])
async def test_a_deeply_nested_engine_answer_is_an_engine_error(engine_status: int) -> None:
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        body = b'{"error":{"message":' + DEEP + b"}}" if engine_status == 500 else DEEP
        return web.Response(status=engine_status, body=body, content_type="application/json")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_waiting 0\n")

    engine = web.Application()
    engine.router.add_post("/v1/chat/completions", answer)
    engine.router.add_get("/metrics", metrics)
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    async with serve(engine) as served, running_sidecar(served.url) as sc:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{sc.url}/v1/chat/completions", json=chat) as r,
        ):
            assert r.status == 502, await r.text()
            assert (await r.json())["error"]["code"] == "engine_error"
