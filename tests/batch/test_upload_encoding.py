"""Content-Encoding on the Batch API's bodies, against the running service and both stores (a
real SQLite file, a real redis-server): a gzip or deflate request, or file part, is stored
decoded; the size limit counts decoded bytes and stops a bomb early with bounded memory; a
corrupt stream is a 400 and an unsupported coding a 415, all in OpenAI's error shape."""

from __future__ import annotations

import asyncio
import base64
import gzip
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from fleetwarden.batch.clock import ManualClock
from fleetwarden.batch.service import BatchService, Overrides
from tests.batch.builders import chat_line, jsonl
from tests.batch.harness import TOKEN_A, running_service, service_config
from tests.batch.stub_engine import StubEngine

LIMIT = 1_000_000
AUTH = {"Authorization": f"Bearer {TOKEN_A}"}
FORM = {**AUTH, "Content-Type": "multipart/form-data; boundary=XYZ"}
LINES = jsonl([chat_line(f"req-{i}") for i in range(3)])
BIG = jsonl([chat_line(f"req-{i}", pad=f"{i * 7919:x}" * 20) for i in range(3000)])
"""About 700 KB, several read chunks on the wire even compressed."""


def form(content: bytes, part_headers: dict[str, str] | None = None) -> bytes:
    """A multipart/form-data body (boundary XYZ) with purpose=batch and a file part."""
    extra = "".join(f"{name}: {value}\r\n" for name, value in (part_headers or {}).items())
    return (
        b'--XYZ\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--XYZ\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        + extra.encode()
        + b"Content-Type: application/jsonl\r\n\r\n"
        + content
        + b"\r\n--XYZ--\r\n"
    )


def gzip_bomb(decoded_mib: int) -> bytes:
    """`decoded_mib` MiB of newlines (valid, empty JSONL lines) as a small gzip stream."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    newlines = b"\n" * (1 << 20)
    return b"".join(compressor.compress(newlines) for _ in range(decoded_mib)) + compressor.flush()


@pytest.fixture
async def service(store_config: dict[str, Any], engine: StubEngine) -> AsyncIterator[BatchService]:
    config = service_config(
        store_config,
        engine.base_url,
        quotas={"default": {"max_file_bytes": LIMIT, "max_queued_items": 100_000}},
    )
    async with running_service(
        config, Overrides(clock=ManualClock(1_800_000_000.0)), loops=False
    ) as running:
        yield running


async def call(
    service: BatchService, path: str, body: Any, headers: dict[str, str]
) -> tuple[int, dict[str, Any], Any]:
    """Status, headers and JSON body of one POST; the body goes out exactly as given."""
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.post(
            f"http://127.0.0.1:{service.port}{path}", data=body, headers=headers, compress=None
        ) as response,
    ):
        return response.status, dict(response.headers), await response.json(content_type=None)


async def stored(service: BatchService, file_id: str) -> bytes:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"http://127.0.0.1:{service.port}/v1/files/{file_id}/content", headers=AUTH
        ) as response,
    ):
        assert response.status == 200
        return await response.read()


async def upload(service: BatchService, body: Any, headers: dict[str, str]) -> bytes:
    """POST /v1/files; asserts it was accepted and returns what the store holds."""
    status, _, answer = await call(service, "/v1/files", body, {**FORM, **headers})
    assert status == 200, answer
    return await stored(service, answer["id"])


def assert_error(answer: tuple[int, dict[str, Any], Any], status: int, code: str) -> str:
    """The answer is OpenAI's error shape with this status and code; returns its message."""
    got, headers, body = answer
    assert (got, headers["Content-Type"].split(";")[0]) == (status, "application/json"), body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == code
    return str(body["error"]["message"])


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", raw_deflate),
        ("identity", bytes),
    ],
)
@pytest.mark.parametrize("content", [LINES, BIG], ids=["small", "big"])
async def test_an_encoded_request_stores_the_decoded_file(
    service: BatchService, coding: str, encode: Any, content: bytes
) -> None:
    assert await upload(service, encode(form(content)), {"Content-Encoding": coding}) == content


async def test_an_encoded_request_streamed_in_chunks_stores_the_decoded_file(
    service: BatchService,
) -> None:
    """No Content-Length (chunked transfer): decoded as it arrives."""
    body = gzip.compress(form(BIG))

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 10_000):
            yield body[start : start + 10_000]

    assert await upload(service, chunks(), {"Content-Encoding": "gzip"}) == BIG


@pytest.mark.parametrize("content", [LINES, BIG], ids=["small", "big"])
@pytest.mark.parametrize(
    "part_headers",
    [
        {"Content-Encoding": "gzip"},
        {"Content-Encoding": "GZIP"},
        {"Content-Encoding": "gzip", "Content-Transfer-Encoding": "base64"},
    ],
)
async def test_a_gzip_file_part_is_stored_decoded(
    service: BatchService, part_headers: dict[str, str], content: bytes
) -> None:
    """RFC 7578 section 4.8 tells servers to ignore a part's Content-Encoding, which stored the
    compressed bytes as the file; a client that sends one means its file is compressed."""
    encoded = gzip.compress(content)
    if part_headers.get("Content-Transfer-Encoding") == "base64":
        encoded = base64.encodebytes(encoded)
    assert await upload(service, form(encoded, part_headers), {}) == content


async def test_a_long_preamble_is_accepted_as_in_an_identity_body(service: BatchService) -> None:
    body = b"x" * 300_000 + b"\r\n" + form(LINES)
    assert await upload(service, body, {}) == LINES
    assert await upload(service, gzip.compress(body), {"Content-Encoding": "gzip"}) == LINES


async def test_a_gzip_part_inside_a_gzip_request_is_decoded_twice(service: BatchService) -> None:
    body = gzip.compress(form(gzip.compress(BIG), {"Content-Encoding": "gzip"}))
    assert await upload(service, body, {"Content-Encoding": "gzip"}) == BIG


async def test_an_identity_part_is_stored_as_sent(service: BatchService) -> None:
    assert await upload(service, form(LINES, {"Content-Encoding": "identity"}), {}) == LINES


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "gzip, gzip", "bogus"])
async def test_an_unsupported_request_coding_is_a_415_naming_the_supported_ones(
    service: BatchService, coding: str
) -> None:
    """br and zstd included: aiohttp answered them with a text/plain 400 before any handler
    ran, and stored an unknown coding's bytes as the file."""
    answer = await call(service, "/v1/files", form(LINES), {**FORM, "Content-Encoding": coding})
    message = assert_error(answer, 415, "unsupported_content_encoding")
    assert "gzip, deflate, identity" in message
    assert answer[1]["Accept-Encoding"] == "gzip, deflate, identity"


@pytest.mark.parametrize("coding", ["br", "zstd", "bogus"])
async def test_an_unsupported_part_coding_is_a_415(service: BatchService, coding: str) -> None:
    body = form(b"\x00\x01 not what the client meant", {"Content-Encoding": coding})
    answer = await call(service, "/v1/files", body, FORM)
    message = assert_error(answer, 415, "unsupported_content_encoding")
    assert f"{coding!r}" in message
    assert answer[2]["error"]["param"] == "file"


CORRUPT = {
    "not gzip": ("gzip", form(LINES), "incorrect header check"),
    "wrong checksum": (
        "gzip",
        gzip.compress(form(LINES))[:-8] + b"\0\0\0\0" + gzip.compress(form(LINES))[-4:],
        "incorrect data check",
    ),
    "cut off": ("gzip", gzip.compress(form(LINES))[:-10], "ends early"),
    "cut off after the closing boundary": (
        "gzip",
        gzip.compress(form(LINES) + b"x" * 100)[:-9],
        "ends early",
    ),
    "trailing junk": ("gzip", gzip.compress(form(LINES)) + b"junk", "incorrect header check"),
    "deflate cut off": ("deflate", zlib.compress(form(LINES))[:-6], "ends early"),
    "deflate without its final block": ("deflate", b"\x00\x00\x00\xff\xff" * 10, "ends early"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
async def test_a_corrupt_request_body_is_a_400_naming_the_problem(
    service: BatchService, case: str
) -> None:
    """It was a 500 (an exception from aiohttp's decoder) or aiohttp's text/plain error (cut
    deflate), and a gzip stream cut after the closing boundary was stored as if whole."""
    coding, body, problem = CORRUPT[case]
    headers = {**FORM, "Content-Encoding": coding}
    answer = await asyncio.wait_for(call(service, "/v1/files", body, headers), 30)
    message = assert_error(answer, 400, "invalid_content_encoding")
    assert message.startswith(f"the request body does not decode as its Content-Encoding {coding}")
    assert problem in message


@pytest.mark.parametrize(
    ("encoded", "problem"),
    [
        (LINES, "incorrect header check"),
        (gzip.compress(LINES)[:-10], "ends early"),
        (
            gzip.compress(LINES)[:-8] + b"\0\0\0\0" + gzip.compress(LINES)[-4:],
            "incorrect data check",
        ),
    ],
)
async def test_a_corrupt_gzip_part_is_a_400_naming_the_problem(
    service: BatchService, encoded: bytes, problem: str
) -> None:
    body = form(encoded, {"Content-Encoding": "gzip"})
    answer = await call(service, "/v1/files", body, FORM)
    message = assert_error(answer, 400, "invalid_content_encoding")
    assert message.startswith("part 'file' does not decode as its Content-Encoding gzip")
    assert problem in message
    assert answer[2]["error"]["param"] == "file"


@pytest.mark.parametrize("level", ["request", "part"])
async def test_a_decompression_bomb_is_a_413_without_inflating_it(
    service: BatchService, level: str
) -> None:
    """256 MiB of newlines in 250 KB of gzip, against a 1 MB limit: refused as soon as the
    decoded file passes the limit, while the service's allocations stay a few MiB."""
    if level == "request":
        compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        head, tail = form(b"SPLIT").split(b"SPLIT")
        chunks = [compressor.compress(head)]
        chunks += [compressor.compress(b"\n" * (1 << 20)) for _ in range(256)]
        body = b"".join([*chunks, compressor.compress(tail), compressor.flush()])
        headers = {**FORM, "Content-Encoding": "gzip"}
    else:
        body, headers = form(gzip_bomb(256), {"Content-Encoding": "gzip"}), FORM
    assert len(body) < 300_000
    tracemalloc.start()
    try:
        answer = await call(service, "/v1/files", body, headers)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = assert_error(answer, 413, "file_too_large")
    assert f"limit of {LIMIT} bytes" in message
    assert peak < 16 << 20, f"peak {peak} bytes"


async def test_compressed_bytes_are_bounded_too(service: BatchService) -> None:
    """A deflate stream of empty blocks decodes to nothing: without a bound on the compressed
    bytes, one request could stream forever. Chunked, so no Content-Length check applies."""
    empty_block = b"\x00\x00\x00\xff\xff"  # a stored block of no bytes, not the last

    async def endless() -> AsyncIterator[bytes]:
        for _ in range(1000):  # 5 MB, far past the bound; the service stops reading first
            yield empty_block * 1000

    headers = {**FORM, "Content-Encoding": "deflate"}
    assert_error(await call(service, "/v1/files", endless(), headers), 413, "file_too_large")


async def test_a_gzip_json_body_is_decoded(service: BatchService) -> None:
    """aiohttp's own decoding is off for the app; JSON bodies get the same decoder."""
    file_id = (await call(service, "/v1/files", form(LINES), FORM))[2]["id"]
    request = (
        b'{"input_file_id": "%s", "endpoint": "/v1/chat/completions", '
        b'"completion_window": "24h"}' % file_id.encode()
    )
    headers = {**AUTH, "Content-Type": "application/json", "Content-Encoding": "gzip"}
    status, _, batch = await call(service, "/v1/batches", gzip.compress(request), headers)
    assert status == 200, batch
    assert (batch["input_file_id"], batch["request_counts"]["total"]) == (file_id, 3)


@pytest.mark.parametrize(
    ("body", "coding", "status", "code"),
    [
        (gzip.compress(b"{" + b" " * 10_000_000 + b"}"), "gzip", 413, "request_too_large"),
        (b"{}", "br", 415, "unsupported_content_encoding"),
        (b"{}", "gzip", 400, "invalid_content_encoding"),
    ],
    ids=["bomb", "br", "not gzip"],
)
async def test_json_bodies_follow_the_same_rules(
    service: BatchService, body: bytes, coding: str, status: int, code: str
) -> None:
    headers = {**AUTH, "Content-Type": "application/json", "Content-Encoding": coding}
    assert_error(await call(service, "/v1/batches", body, headers), status, code)
