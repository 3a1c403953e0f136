"""Malformed requests get OpenAI error JSON with a 4xx, never aiohttp's text/plain 500, and a
refused cancel names the status the client sees. Both stores (a real SQLite file, a real
redis-server) where the request reaches the store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from fleetwarden.batch.clock import ManualClock
from fleetwarden.batch.service import BatchService, Overrides
from tests.batch.builders import chat_line, jsonl
from tests.batch.harness import (
    TOKEN_A,
    create_batch,
    running_service,
    service_config,
    sqlite_store,
)
from tests.batch.stub_engine import StubEngine

AUTH = {"Authorization": f"Bearer {TOKEN_A}"}
WRONG_BOUNDARY = (
    b'--XYZ\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--WRONG--\r\n'
)
"""A multipart body whose closing delimiter is not its boundary: aiohttp reads past the end."""
MULTIPART_XYZ = {**AUTH, "Content-Type": "multipart/form-data; boundary=XYZ"}


@pytest.fixture
async def service(store_config: dict[str, Any], engine: StubEngine) -> AsyncIterator[BatchService]:
    config = service_config(store_config, engine.base_url, spot_url=engine.base_url)
    overrides = Overrides(clock=ManualClock(1_800_000_000.0))
    async with running_service(config, overrides, loops=False) as running:
        yield running


async def call(
    port: int, method: str, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, str, dict[str, Any]]:
    """Status, content type and JSON body of one request."""
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, f"http://127.0.0.1:{port}{path}", data=body, headers=headers
        ) as response,  # fmt: skip
    ):
        return response.status, response.content_type, await response.json(content_type=None)


def assert_openai_error(answer: tuple[int, str, dict[str, Any]], status: int, code: str) -> None:
    got_status, content_type, body = answer
    assert (got_status, content_type) == (status, "application/json"), body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code


async def test_an_input_file_id_that_no_store_can_hold_is_not_found(
    service: BatchService,
) -> None:
    body = (
        b'{"input_file_id":"\\ud800","endpoint":"/v1/chat/completions","completion_window":"24h"}'
    )
    headers = {**AUTH, "Content-Type": "application/json"}
    answer = await call(service.port, "POST", "/v1/batches", body, headers)
    assert_openai_error(answer, 404, "not_found")
    assert answer[2]["error"]["param"] == "input_file_id"


async def test_a_multipart_body_that_breaks_its_framing_is_a_400(service: BatchService) -> None:
    answer = await call(service.port, "POST", "/v1/files", WRONG_BOUNDARY, MULTIPART_XYZ)
    assert_openai_error(answer, 400, "invalid_request")
    assert "multipart" in answer[2]["error"]["message"]


async def test_a_token_that_is_not_utf8_is_an_unknown_token(service: BatchService) -> None:
    """aiohttp decodes header bytes with surrogateescape; hashing must not choke on them."""
    reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
    writer.write(b"GET /v1/batches HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-\xff\r\n"
                 b"Connection: close\r\n\r\n")  # fmt: skip
    await writer.drain()
    head, _, body = (await reader.read()).partition(b"\r\n\r\n")
    writer.close()
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 401 Unauthorized"
    assert b"application/json" in head
    assert b'"invalid_api_key"' in body


async def test_cancelling_a_finalizing_batch_names_the_status_it_shows(
    service: BatchService,
) -> None:
    batch_id = await create_batch(service, jsonl([chat_line("only")]))
    await service.maintenance.run_once()
    assert service.dispatcher is not None
    for target in service.dispatcher.targets:
        await service.dispatcher.signal(target)
    await service.dispatcher.drain()  # settled, and no maintenance round to finalise it yet
    path = f"/v1/batches/{batch_id}"
    shown = await call(service.port, "GET", path, b"", AUTH)
    assert shown[2]["status"] == "finalizing"
    answer = await call(service.port, "POST", f"{path}/cancel", b"", AUTH)
    assert_openai_error(answer, 409, "invalid_status")
    assert f"batch {batch_id} is finalizing" in answer[2]["error"]["message"]


async def test_the_middleware_answers_request_parsing_errors_400_and_bugs_500(
    tmp_path: Path, engine: StubEngine
) -> None:
    """A ValueError from aiohttp reading a malformed request, which a handler did not catch,
    is the client's 400; a ValueError from the service's own code is a 500 (never masked as the
    client's fault), both in OpenAI's error shape."""

    async def unguarded_multipart(request: web.Request) -> web.Response:
        reader = await request.multipart()
        while await reader.next() is not None:
            pass
        return web.json_response({})

    async def buggy(request: web.Request) -> web.Response:
        raise ValueError("a bug in the service")

    config = service_config(sqlite_store(tmp_path), engine.base_url)
    async with running_service(config, loops=False) as service:
        app = service.api.app()
        app.router.add_post("/v1/probe/multipart", unguarded_multipart)
        app.router.add_post("/v1/probe/bug", buggy)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = int(runner.addresses[0][1])
        try:
            parsing = await call(port, "POST", "/v1/probe/multipart", WRONG_BOUNDARY, MULTIPART_XYZ)
            bug = await call(port, "POST", "/v1/probe/bug", b"", AUTH)
        finally:
            await runner.cleanup()
    assert_openai_error(parsing, 400, "invalid_request")
    assert bug[0] == 500
    assert bug[2]["error"]["type"] == "server_error"
    assert "a bug" not in bug[2]["error"]["message"]  # internals stay in the log
