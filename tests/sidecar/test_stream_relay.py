"""The protocol-level relay's byte work against plain references, under any read boundaries:
the chunked decoder of `upstream.EngineConnection` (several responses on one kept-alive
connection) and the byte-scan counting of `stream.StreamRelay`, alone and chained.
"""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.sidecar.stream import StreamRelay
from fleetwarden.sidecar.upstream import EngineClosedError, EngineConnection
from tests.sidecar.sse_events import COMMENT, DONE, ROLE, USAGE, token

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def cut(data: bytes, points: list[int]) -> list[bytes]:
    marks = sorted({p % (len(data) + 1) for p in points} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(marks) if b > a]


def frame(body: bytes, sizes: list[int], extension: bool) -> bytes:
    """`body` in chunks of the given sizes (cycled), then the last chunk."""
    out, pos = [], 0
    for size in itertools.cycle(sizes or [len(body) or 1]):
        if pos >= len(body):
            break
        piece = body[pos : pos + size]
        pos += size
        out.append(b"%x%s\r\n%b\r\n" % (len(piece), b";x=1" if extension else b"", piece))
    return b"".join(out) + b"0\r\n\r\n"


class Client:
    """The client's transport: keeps what is written, decodes it as a chunked body."""

    def __init__(self) -> None:
        self.written = b""
        self.output_size = 0

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def body(self) -> bytes:
        out, pos = [], 0
        while pos < len(self.written):
            eol = self.written.index(b"\r\n", pos)
            size = int(self.written[pos:eol], 16)
            assert size > 0, "no empty chunk: it would end the client's body"
            out.append(self.written[eol + 2 : eol + 2 + size])
            assert self.written[eol + 2 + size : eol + 4 + size] == b"\r\n"
            pos = eol + 4 + size
        return b"".join(out)


def stream_relay(wants_usage: bool) -> tuple[StreamRelay, list[int], Client]:
    charged: list[int] = []
    scheduler = SimpleNamespace(on_output=lambda request, n, now: charged.append(n))
    dispatcher: Any = SimpleNamespace(clock=lambda: 1.0, scheduler=scheduler)
    metrics: Any = SimpleNamespace(inter_token_now=SimpleNamespace(observe=lambda gap: None))
    flight: Any = SimpleNamespace(
        request=object(),
        call=SimpleNamespace(client_wants_usage=wants_usage),
        first_token_s=None,
        last_token_s=None,
        fluidity=None,
    )
    client = Client()
    upstream: Any = SimpleNamespace(pause_reading=None, resume_reading=None)
    relay = StreamRelay(flight, dispatcher, metrics, cast(Any, client), client, True, upstream)
    return relay, charged, client


# Token texts include what could fool a byte scan: quotes, newlines, `data:` and the markers.
texts = st.lists(
    st.sampled_from(
        ["t", " a", "data: x", "\n\ndata:", '"usage":{', '"role":"assistant"', "[DONE]", "é"]
    ),
    max_size=12,
)


def sse_stream(contents: list[str], comment: bool, wants_usage: bool) -> tuple[bytes, bytes]:
    """An engine's event stream and what the client must get of it."""
    events = [ROLE, *(token(t) for t in contents)]
    if comment:
        events.insert(1, COMMENT)
    usage = USAGE % len(contents)
    return b"".join([*events, usage, DONE]), b"".join([*events, usage if wants_usage else b""])


@given(texts, st.lists(st.integers(0, 4000), max_size=10), st.booleans(), st.booleans())
def test_byte_scan_charges_and_forwards_like_the_plain_reference(
    contents: list[str], points: list[int], comment: bool, wants_usage: bool
) -> None:
    async def run() -> None:
        stream, expected = sse_stream(contents, comment, wants_usage)
        relay, charged, client = stream_relay(wants_usage)
        for piece in cut(stream, points):
            relay.on_body(piece)
        assert sum(charged) == len(contents)
        assert relay.usage == {"prompt_tokens": 3, "completion_tokens": len(contents)}
        assert client.body() == expected + DONE
        assert client.output_size == len(client.written)

    asyncio.run(run())


class EngineSocket:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def abort(self) -> None:
        self.aborted = True


class Sink:
    def __init__(self) -> None:
        self.body = b""
        self.ended = False

    def on_body(self, data: bytes) -> None:
        assert not self.ended
        self.body += data

    def on_end(self) -> None:
        self.ended = True

    def on_error(self, exc: Exception) -> None:
        raise AssertionError(exc)


async def exchange(
    connection: EngineConnection, response: bytes, points: list[int], attach_late: bool
) -> Sink:
    """One request on `connection`, its response fed in reads cut at `points`."""
    request = asyncio.ensure_future(connection.request(b"POST / HTTP/1.1\r\n\r\n", b"{}", 5.0))
    await asyncio.sleep(0)
    sink = Sink()
    attached = False
    for piece in cut(response, points):
        connection.data_received(piece)
        await asyncio.sleep(0)  # the head's waiter runs
        if request.done() and not attached and not attach_late:
            connection.attach(sink, 5.0)
            attached = True
    assert await request == (200, {"content-type": "text/event-stream", "transfer-encoding": "chunked"})  # fmt: skip
    if not attached:
        connection.attach(sink, 5.0)  # everything arrived before: the early reads
    return sink


bodies = st.lists(st.binary(max_size=60), min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    bodies,
    st.lists(st.integers(1, 50), max_size=4),
    st.lists(st.integers(0, 10_000), max_size=12),
    st.booleans(),
    st.booleans(),
)
def test_chunked_bodies_decode_whatever_the_read_and_chunk_boundaries(
    responses: list[bytes], sizes: list[int], points: list[int], extension: bool, late: bool
) -> None:
    async def run() -> None:
        connection = EngineConnection()
        socket = EngineSocket()
        connection.connection_made(cast(Any, socket))
        for body in responses:  # one after the other on the kept-alive connection
            sink = await exchange(connection, HEAD + frame(body, sizes, extension), points, late)
            assert sink.body == body
            assert sink.ended
            assert connection.reusable
        assert not socket.aborted

    asyncio.run(run())


@settings(max_examples=100, deadline=None)
@given(
    texts,
    st.lists(st.integers(1, 300), max_size=4),
    st.lists(st.integers(0, 10_000), max_size=12),
    st.booleans(),
)
def test_engine_bytes_to_client_body_end_to_end(
    contents: list[str], sizes: list[int], points: list[int], wants_usage: bool
) -> None:
    async def run() -> None:
        stream, expected = sse_stream(contents, False, wants_usage)
        connection = EngineConnection()
        connection.connection_made(cast(Any, EngineSocket()))
        relay, charged, client = stream_relay(wants_usage)
        request = asyncio.ensure_future(connection.request(b"POST / HTTP/1.1\r\n\r\n", b"", 5.0))
        await asyncio.sleep(0)
        connection.data_received(HEAD)
        await request
        connection.attach(relay, 5.0)
        for piece in cut(frame(stream, sizes, False), points):
            connection.data_received(piece)
        assert relay.done.done()
        assert sum(charged) == len(contents)
        assert client.body() == expected + DONE

    asyncio.run(run())


def _fails_framing(reads: list[bytes]) -> None:
    """Feed `reads` as the body after a chunked head: the sink gets an EngineClosedError, the
    engine's socket is aborted and the connection is not reusable."""

    async def run() -> None:
        connection = EngineConnection()
        socket = EngineSocket()
        connection.connection_made(cast(Any, socket))
        request = asyncio.ensure_future(connection.request(b"POST / HTTP/1.1\r\n\r\n", b"", 5.0))
        await asyncio.sleep(0)
        connection.data_received(HEAD)
        await request
        errors: list[Exception] = []
        sink = SimpleNamespace(on_body=lambda data: None, on_end=None, on_error=errors.append)
        connection.attach(cast(Any, sink), 5.0)
        for data in reads:
            connection.data_received(data)
        assert isinstance(errors[0], EngineClosedError)
        assert socket.aborted
        assert not connection.reusable

    asyncio.run(run())


@pytest.mark.parametrize("line", [b"-5", b"", b"zz", b"1_0", b"+5", b" 5", b"\n5"])
def test_a_bad_chunk_size_fails_the_response(line: bytes) -> None:
    _fails_framing([line + b"\r\nhello\r\n"])


@pytest.mark.parametrize(
    "reads",
    [
        [b"5\r\nhelloXY5\r\nworld\r\n"],  # not CRLF after the data, in one read
        [b"5\r\nhello", b"XY5\r\nworld\r\n"],  # ... and in the next read
        [b"5\r\nhello\r\n" + b"9" * 8192],  # a chunk-size line with no end
    ],
)
def test_bad_chunk_framing_fails_the_response(reads: list[bytes]) -> None:
    _fails_framing(reads)


@pytest.mark.parametrize(
    ("ending", "reusable"),
    [
        (b"0\r\n\r\n", True),
        (b"0\r\nX-Trailer: 1\r\n\r\n", True),
        (b"0\r\n\r\nHTTP/1.1 200 OK\r\n", False),  # bytes after the response
    ],
)
def test_the_last_chunk_with_trailers_or_bytes_after_it(ending: bytes, reusable: bool) -> None:
    async def run() -> None:
        connection = EngineConnection()
        connection.connection_made(cast(Any, EngineSocket()))
        sink = await exchange(connection, HEAD + b"5\r\nhello\r\n" + ending, [], False)
        assert sink.body == b"hello"
        assert sink.ended
        assert connection.reusable is reusable

    asyncio.run(run())
