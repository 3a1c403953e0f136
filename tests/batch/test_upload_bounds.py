"""Bounds on an identity (uncompressed) upload form, against the running service: sent chunked
(no Content-Length to check up front) its bytes are counted as they are read, against the
tenant's file limit plus the form's slack; a repeated `file` or `purpose` part and more than
`MAX_FIELDS` fields are refused rather than silently reduced to one. A large file is joined and
counted off the event loop."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fleetwarden.batch import api, uploads
from fleetwarden.batch.clock import ManualClock
from fleetwarden.batch.service import BatchService, Overrides
from tests.batch.builders import chat_line, jsonl
from tests.batch.harness import TOKEN_A, running_service, service_config, sqlite_store

LIMIT = 4000
"""team-a's max_file_bytes; the whole form may be up to 64 KiB more."""
AUTH = {"Authorization": f"Bearer {TOKEN_A}"}
FORM = {**AUTH, "Content-Type": "multipart/form-data; boundary=XYZ"}
LINES = jsonl([chat_line(f"req-{i}") for i in range(3)])
MAX_FIELDS = 8
"""`uploads.MAX_FIELDS`, spelled out so that every test here runs against any uploads.py."""
LARGE = 2 << 20
"""Bytes of a file past `uploads.OFF_LOOP_BYTES`."""


def test_the_bounds_are_the_modules() -> None:
    assert uploads.MAX_FIELDS == MAX_FIELDS
    assert uploads.OFF_LOOP_BYTES < LARGE


def part(name: str, data: bytes, filename: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    return f"--XYZ\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n"


PURPOSE = part("purpose", b"batch")
END = b"--XYZ--\r\n"


def file_part(content: bytes = LINES) -> bytes:
    return part("file", content, "in.jsonl")


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[BatchService]:
    config = service_config(
        sqlite_store(tmp_path),
        "http://127.0.0.1:9",
        quotas={"tenants": {"team-a": {"max_file_bytes": LIMIT}}},
    )
    overrides = Overrides(clock=ManualClock(1_800_000_000.0))
    async with running_service(config, overrides, loops=False) as running:
        yield running


async def post_chunked(service: BatchService, pieces: Iterable[bytes]) -> tuple[int, Any]:
    """POST /v1/files with the body sent chunked (an async generator: no Content-Length)."""

    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{service.port}/v1/files", data=body(), headers=FORM
        ) as response,
    ):
        return response.status, await response.json(content_type=None)


def assert_error(answer: tuple[int, Any], status: int, code: str, param: str | None) -> str:
    got, body = answer
    assert got == status, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert (body["error"]["code"], body["error"]["param"]) == (code, param)
    return str(body["error"]["message"])


async def test_a_chunked_form_within_the_limit_is_stored(service: BatchService) -> None:
    content = b"x" * LIMIT
    fields = [part(f"extra{i}", b"v" * 1000) for i in range(MAX_FIELDS - 1)]
    status, body = await post_chunked(service, [PURPOSE, *fields, file_part(content), END])
    assert status == 200, body
    assert body["bytes"] == LIMIT


async def test_a_chunked_form_is_counted_as_it_is_read(service: BatchService) -> None:
    """A valid form behind 1 MiB of preamble lines, sent chunked: every byte of it used to be
    read (and the file stored); it is refused once the form passes the limit + 64 KiB."""
    preamble = [b"p" * 1000 + b"\r\n"] * 1024
    answer = await post_chunked(service, [*preamble, PURPOSE, file_part(), END])
    assert f"limit of {LIMIT} bytes" in assert_error(answer, 413, "file_too_large", "file")


async def test_many_chunked_fields_are_refused(service: BatchService) -> None:
    """The review's form: field after field of 1,000 bytes, each within the field limit."""
    fields = [part(f"junk{i}", b"j" * 1000) for i in range(2000)]
    answer = await post_chunked(service, [PURPOSE, *fields, file_part(), END])
    if answer[0] == 400:  # the ninth field, unless the first read already passed 64 KiB
        message = assert_error(answer, 400, "invalid_request", None)
        assert f"more than {MAX_FIELDS} fields" in message
    else:
        assert_error(answer, 413, "file_too_large", "file")


async def test_more_than_max_fields_is_a_400(service: BatchService) -> None:
    fields = [part(f"extra{i}", b"v") for i in range(MAX_FIELDS)]
    answer = await post_chunked(service, [PURPOSE, *fields, file_part(), END])
    message = assert_error(answer, 400, "invalid_request", None)
    assert f"more than {MAX_FIELDS} fields besides the file" in message


@pytest.mark.parametrize(
    ("form", "param"),
    [
        ([PURPOSE, file_part(b"first\n"), file_part(b"second\n")], "file"),
        ([PURPOSE, file_part(), part("purpose", b"batch")], "purpose"),
        ([PURPOSE, part("purpose", b"fine-tune"), file_part()], "purpose"),
    ],
    ids=["file", "purpose-after-file", "purpose"],
)
async def test_a_repeated_part_is_a_400(
    service: BatchService, form: list[bytes], param: str
) -> None:
    """Each repeated part used to replace the one before it, silently."""
    message = assert_error(await post_chunked(service, [*form, END]), 400, "invalid_request", param)
    assert f"more than one '{param}' part" in message


async def test_a_large_file_is_joined_and_counted_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Joining 100 MB of chunks and counting its lines take a tenth of a second each; on the
    event loop (this test's thread) that stalls every tenant's requests."""
    joined_on: list[tuple[int, int]] = []  # (size, thread) of every part joined
    counted_on: list[tuple[int, int]] = []
    join, count = uploads._join, api.count_lines

    def recording_join(chunks: list[bytes]) -> bytes:
        joined = join(chunks)
        joined_on.append((len(joined), threading.get_ident()))
        return joined

    def recording_count(content: bytes) -> int:
        counted_on.append((len(content), threading.get_ident()))
        return count(content)

    monkeypatch.setattr(uploads, "_join", recording_join)
    monkeypatch.setattr(api, "count_lines", recording_count)
    config = service_config(sqlite_store(tmp_path), "http://127.0.0.1:9")
    content = b'{"x": 1}\n' * (LARGE // 9)
    async with running_service(config, loops=False) as running:
        for file in (content, LINES):
            status, body = await post_chunked(running, [PURPOSE, file_part(file), END])
            assert status == 200, body
            assert body["bytes"] == len(file)
    loop = threading.get_ident()
    assert [size for size, _ in counted_on] == [len(content), len(LINES)]
    assert [size for size, _ in joined_on] == [5, len(content), 5, len(LINES)]  # purpose, file
    # the large file off the loop; small parts on it (no thread hop needed)
    assert joined_on[1][1] != loop
    assert counted_on[0][1] != loop
    assert {thread for _, thread in [joined_on[0], *joined_on[2:], counted_on[1]]} == {loop}
