"""The streaming relay's engine client (`upstream.EnginePool`) on real sockets.

A raw-socket engine streams chunked server-sent events, several HTTP chunks per write, so one
read of the sidecar carries several chunks and streams end together, as vLLM's decode steps do.
The engine counts the requests it saw and the streams whose connection was dropped under them:
a relay that hands a pooled connection to a second request while the first one's owner still
holds it aborts the second request on the engine (it once hung the lockstep bench at K=3).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import cast

from fleetwarden.sidecar.engine_pool import EnginePool
from fleetwarden.sidecar.upstream import Collect, EngineConnection
from tests.sidecar.raw_engine import METRICS_RESPONSE, next_request
from tests.support.sidecar_stack import running_sidecar


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def _event(delta: dict[str, str]) -> bytes:
    chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    return _chunk(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
ROLE = _event({"role": "assistant", "content": ""})
TOKEN = _event({"content": "t "})


def _tail(tokens: int) -> bytes:
    usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": tokens}}
    payload = b"data: " + json.dumps(usage).encode() + b"\n\n"
    return _chunk(payload) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


@dataclass
class Engine:
    """Streams `tokens` tokens per request, `per_write` chunks per write, all streams at once."""

    tokens: int
    per_write: int
    step_s: float = 0.0
    posts: int = 0
    dropped: int = 0
    """Streams whose connection closed before their last byte was written."""
    active: list[EngineStream] = field(default_factory=list)

    def step(self) -> None:
        streams, self.active = self.active, []
        for stream in streams:
            if stream.transport.is_closing():
                self.dropped += 1
                continue
            n = min(self.per_write, stream.left)
            stream.left -= n
            data = TOKEN * n
            if stream.left == 0:
                data += _tail(self.tokens)
            else:
                self.active.append(stream)
            stream.transport.write(data)
        asyncio.get_running_loop().call_later(self.step_s, self.step)


class EngineStream(asyncio.Protocol):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.buf = b""
        self.left = 0
        self.transport = cast(asyncio.Transport, None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.engine.active:
            self.engine.active.remove(self)
            self.engine.dropped += 1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (request := next_request(self.buf)) is not None:
            head, _, self.buf = request
            if head.startswith("GET /metrics"):
                self.transport.write(METRICS_RESPONSE)
            else:
                assert self not in self.engine.active, "a second request on a busy connection"
                self.engine.posts += 1
                self.left = self.engine.tokens
                self.transport.write(HEAD + ROLE)
                self.engine.active.append(self)


@contextlib.asynccontextmanager
async def running_engine(tokens: int, per_write: int) -> AsyncIterator[tuple[str, Engine]]:
    engine = Engine(tokens, per_write)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: EngineStream(engine), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    ticker = loop.call_soon(engine.step)
    try:
        yield f"http://127.0.0.1:{port}", engine
    finally:
        ticker.cancel()
        server.close()


async def _body(pool: EnginePool, url_path: str) -> tuple[EngineConnection, bytes]:
    connection, status, _ = await pool.request("POST", url_path, {}, b"{}", 5.0)
    assert status == 200
    sink = Collect()
    connection.attach(sink, 5.0)
    return connection, await asyncio.wait_for(sink.done, 5.0)


async def test_a_finished_connection_is_reused_only_after_its_owner_released_it() -> None:
    async with running_engine(tokens=4, per_write=3) as (url, engine):
        pool = EnginePool(url, connect_timeout_s=1.0)
        first, body = await _body(pool, "/v1/chat/completions")
        assert body.count(b'"content":"t ') == 4
        assert body.endswith(b"data: [DONE]\n\n")
        # The body ended but its owner has not released the connection yet: not reusable.
        second, _ = await _body(pool, "/v1/chat/completions")
        assert second is not first
        pool.release(first)  # the owner's cleanup must not break anything now
        pool.release(second)
        third, _ = await _body(pool, "/v1/chat/completions")
        assert third in (first, second)
        pool.release(third)
        pool.close()
        assert (engine.posts, engine.dropped) == (3, 0)


class Client(asyncio.Protocol):
    """Sends its next request in the callback that saw the previous response end, like a busy
    client on a keep-alive connection (the sidecar then handles it while others still end)."""

    def __init__(self, request: bytes, requests: int) -> None:
        self.request = request
        self.left = requests
        self.tail = b""
        self.tokens = 0
        self.done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.tokens += data.count(b'"content":"t ')
        seen = self.tail + data
        if seen.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):
            self.left -= 1
            if self.left:
                self.transport.write(self.request)
            else:
                self.done.set_result(self.tokens)
            seen = b""
        self.tail = seen[-64:]


async def _client(url: str, requests: int, tokens: int) -> int:
    body = json.dumps(
        {
            "model": "stub-model",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": tokens,
            "stream": True,
        }
    ).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    host, port = url.removeprefix("http://").split(":")
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_connection(
        lambda: Client(request, requests), host, int(port)
    )
    try:
        return await client.done
    finally:
        transport.close()


async def test_streams_ending_together_with_several_chunks_per_read_all_complete() -> None:
    streams, requests, tokens = 128, 4, 16
    async with running_engine(tokens, per_write=3) as (url, engine):
        async with running_sidecar(url) as sidecar:
            clients = [_client(sidecar.url, requests, tokens) for _ in range(streams)]
            got = await asyncio.wait_for(asyncio.gather(*clients), 30.0)
    assert got == [requests * tokens] * streams
    assert (engine.posts, engine.dropped) == (streams * requests, 0)


async def test_a_connection_paused_for_a_slow_client_reads_again_once_pooled() -> None:
    """A relay pauses the engine's socket while its client is slow; when the stream's last read
    is one of those, the connection goes back to the pool paused, and the next request on it
    would never read its response."""
    async with running_engine(tokens=4, per_write=8) as (url, engine):
        pool = EnginePool(url, connect_timeout_s=1.0)
        first, _ = await _body(pool, "/v1/chat/completions")
        assert first.transport is not None
        first.transport.pause_reading()  # as `StreamRelay` does above its high-water mark
        pool.release(first)
        second, body = await asyncio.wait_for(_body(pool, "/v1/chat/completions"), 3.0)
        assert second is first
        assert body.endswith(b"data: [DONE]\n\n")
        pool.release(second)
        pool.close()
        assert (engine.posts, engine.dropped) == (2, 0)


async def test_connections_idle_past_the_reuse_window_are_closed_at_the_next_release() -> None:
    """After a burst, the pool keeps one connection per stream of the burst. Reuse takes the
    newest, so when traffic settles lower the burst's older connections would stay open for as
    long as the engine keeps them; a release closes those idle past the window."""
    async with running_engine(tokens=2, per_write=4) as (url, engine):
        pool = EnginePool(url, connect_timeout_s=1.0, keep_idle_s=1.0)
        burst = [await _body(pool, "/v1/chat/completions") for _ in range(6)]
        for connection, _ in burst:
            pool.release(connection)
        assert pool.idle_connections == 6
        await asyncio.sleep(0.5)  # all six still inside the window
        again, _ = await _body(pool, "/v1/chat/completions")
        assert any(again is connection for connection, _ in burst)  # the newest, reused
        assert pool.idle_connections == 5
        await asyncio.sleep(0.7)  # the five left in the pool are now past the window
        pool.release(again)
        assert pool.idle_connections == 1
        assert all(c.closed for c, _ in burst if c is not again)
        pool.close()
        assert engine.posts == 7
