"""`PUT /admin/config` reads the whole body, however it arrives, up to its 1 MiB limit.

Before the fix one `request.content.read(limit + 1)` took only what had arrived so far: a config
in more than one TCP segment (the TenantPolicy CRD allows 4,096 tenants, about 570 KB) was cut
and refused as invalid JSON, so the operator's push of it failed for ever. A deeply nested
document was a 500 (RecursionError) instead of a 400.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp

from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.sidecar.admin import MAX_CONFIG_BYTES
from tests.support.sidecar_stack import (
    ADMIN_TOKEN,
    SidecarHandle,
    fairness_config,
    running_sidecar,
    running_stub,
)


def config_with_tenants(count: int) -> FairnessConfig:
    document = fairness_config().model_dump()
    document["tenants"] = {
        f"tenant-{i:05d}": {**document["defaults"], "rpm": 100 + i} for i in range(count)
    }
    return FairnessConfig.model_validate(document)


async def send_raw(
    sc: SidecarHandle, head: str, parts: list[bytes], pause_s: float = 0.1
) -> tuple[int, dict[str, object]]:
    """`head` then each of `parts` on one connection, pausing between writes so each part is
    its own TCP segment; the status and JSON body of the answer."""
    host, port = sc.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head.encode())
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(pause_s)
        answer = await reader.read()
    finally:
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    body = rest.partition(b"\r\n\r\n")[2]
    return int(status_line.split()[1]), json.loads(body)


def put_head(length: int | None) -> str:
    framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    return (
        f"PUT /admin/config HTTP/1.1\r\nHost: sidecar\r\nConnection: close\r\n"
        f"Authorization: Bearer {ADMIN_TOKEN}\r\n{framing}\r\n\r\n"
    )


def chunked(data: bytes, size: int) -> list[bytes]:
    pieces = [data[i : i + size] for i in range(0, len(data), size)]
    return [b"%x\r\n%b\r\n" % (len(p), p) for p in pieces] + [b"0\r\n\r\n"]


async def test_a_config_of_thousands_of_tenants_is_applied() -> None:
    config = config_with_tenants(4096)
    document = config.to_document()
    assert 500_000 < len(document) < MAX_CONFIG_BYTES
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        async with (
            aiohttp.ClientSession(headers=sc.admin_headers) as http,
            http.put(f"{sc.url}/admin/config", data=document) as r,
        ):
            assert r.status == 200, await r.text()
            assert await r.json() == {"version": config.version, "changed": True}
        assert len(sc.state.dispatcher.config.tenants) == 4096


async def test_a_body_arriving_in_two_parts_is_read_whole() -> None:
    config = config_with_tenants(100)
    document = config.to_document().encode()
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        status, answer = await send_raw(
            sc, put_head(len(document)), [document[:1000], document[1000:]]
        )
        assert status == 200, answer
        assert answer == {"version": config.version, "changed": True}
        # The same chunked, in pieces that arrive apart.
        status, answer = await send_raw(sc, put_head(None), chunked(document, 4000), 0.02)
        assert status == 200, answer
        assert answer["version"] == config.version


async def test_a_body_past_the_limit_is_413() -> None:
    # Valid JSON all the way (a long string), so only the size can be the reason to refuse it.
    document = json.dumps({"source": "x" * MAX_CONFIG_BYTES}).encode()
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        before = sc.state.dispatcher.scheduler.version
        for head, parts in (
            (put_head(len(document)), [document[:1000], document[1000:]]),
            (put_head(None), chunked(document, 256 * 1024)),
        ):
            status, answer = await send_raw(sc, head, parts, 0.02)
            assert status == 413, answer
            assert answer["error"]["code"] == "request_entity_too_large"  # type: ignore[index]
        assert sc.state.dispatcher.scheduler.version == before


async def test_a_deeply_nested_config_is_invalid_json() -> None:
    deep = b'{"source": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        before = sc.state.dispatcher.scheduler.version
        async with (
            aiohttp.ClientSession(headers=sc.admin_headers) as http,
            http.put(f"{sc.url}/admin/config", data=deep) as r,
        ):
            assert r.status == 400, await r.text()
            assert (await r.json())["error"]["code"] == "invalid_json"
        assert sc.state.dispatcher.scheduler.version == before
