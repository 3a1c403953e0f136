"""Soak and failure tests of the streaming relay, through the real sidecar app on real sockets.

The engine is a raw asyncio server written here (`SoakEngine`), so a test decides byte by byte
what the sidecar receives: chunked server-sent events, several HTTP chunks per write, and on
demand a connection closed after the head, a malformed chunk, a stall, a restart, or a fast
stream of large events. It counts every request it receives by the id in the prompt, the streams
it completed and the streams whose connection was dropped under them, and it honours its own
socket's backpressure. Clients are raw sockets too: they abort at a chosen token, stall, or read
through a small receive buffer.

Only public entry points are used (`build_app`, the sidecar's settings, its metrics and its
scheduler), so the same file also runs against the aiohttp relay it replaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import random
import socket
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest
from aiohttp import web

from fleetwarden.metrics import names
from fleetwarden.sidecar.app import STATE, SidecarState, build_app
from fleetwarden.sidecar.settings import SidecarSettings
from tests.sidecar.raw_engine import METRICS_RESPONSE, next_request
from tests.support.eventually import eventually
from tests.support.relay_mode import relay_under_test
from tests.support.sidecar_stack import ADMIN_TOKEN, SECRET, fairness_config, free_port, serve

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
WARM_ID = 1_000_000
"""Ids from here on are warm-up requests, outside a test's own accounting."""


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def delta(content: dict[str, str]) -> bytes:
    return sse({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": content}]})


ROLE = delta({"role": "assistant", "content": ""})


def token(index: int, pad: int = 0) -> bytes:
    return delta({"content": f"t{index} " + "x" * pad})


def prompt_tokens(rid: int) -> int:
    """What the engine reports as the prompt size of request `rid`."""
    return 5 + rid % 7


def usage_of(rid: int, tokens: int) -> dict[str, int]:
    prompt = prompt_tokens(rid)
    return {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens}


def tail(rid: int, tokens: int) -> bytes:
    usage = sse({"object": "chat.completion.chunk", "choices": [], "usage": usage_of(rid, tokens)})
    return chunk(usage) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


# -- the engine ---------------------------------------------------------------------------------


@dataclass
class Call:
    rid: int
    mode: str
    tokens: int
    per_write: int
    pad: int = 0
    sent: int = 0


class EngineConn(asyncio.Protocol):
    """One connection to the engine: keep-alive, one request at a time."""

    def __init__(self, engine: SoakEngine) -> None:
        self.engine = engine
        self.buf = b""
        self.call: Call | None = None
        self.closed = False
        self.paused = False
        self.paused_count = 0
        self.stale = False
        """The engine restarted and left this idle connection open: it closes on a request."""
        self.transport = cast(asyncio.Transport, None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=64 * 1024)
        self.engine.conns.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.call is not None and self.call.mode in ("ok", "big"):
            self.engine.dropped += 1
            self.engine.active.discard(self)
        self.call = None

    def pause_writing(self) -> None:
        self.paused = True
        self.paused_count += 1

    def resume_writing(self) -> None:
        self.paused = False
        if self.call is not None and self.call.mode == "big":
            self.engine.pump_big(self)

    def data_received(self, data: bytes) -> None:
        if self.stale:
            self.engine.rejected += 1
            self.transport.close()
            return
        self.buf += data
        while (request := next_request(self.buf)) is not None:
            head, body, self.buf = request
            if head.startswith("GET /metrics"):
                self.transport.write(METRICS_RESPONSE)
            else:
                assert self.call is None, "a second request on a busy connection"
                self.engine.on_request(self, json.loads(body))


class SoakEngine:
    """Streams `max_tokens` tokens per request from a ticker, `per_write` (1-3) chunks a write.

    The prompt is `soak <mode> <id>`; `mode` is `ok` (paced stream), `big` (large events as fast
    as the socket takes them), or a fault: `head_then_close`, `bad_chunk_size`, `bad_chunk_crlf`,
    `stall_head`, `stall_body`.
    """

    def __init__(self, step_s: float, pad: int = 0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.step_s = step_s
        self.pad = pad
        self.rng = random.Random(7)
        self.received: Counter[int] = Counter()
        self.conn_of: dict[int, EngineConn] = {}
        self.conns: list[EngineConn] = []
        self.active: set[EngineConn] = set()
        self.completed = 0
        self.dropped = 0
        """Streams whose connection closed before their last byte was written."""
        self.rejected = 0
        self._server: asyncio.Server | None = None
        self._ticker: asyncio.Handle | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: EngineConn(self), "127.0.0.1", self.port)
        self._ticker = loop.call_soon(self.step)

    def stop(self, *, leave_idle_open: bool = False) -> None:
        """A restart: streams in progress die; idle connections close, or stay open as stale."""
        if self._server is not None:
            self._server.close()
        if self._ticker is not None:
            self._ticker.cancel()
        for conn in self.conns:
            if conn.closed:
                continue
            if leave_idle_open and conn.call is None:
                conn.stale = True
            else:
                conn.transport.abort()

    def close_idle(self) -> None:
        """What an engine's keep-alive timeout does (uvicorn: 5 s) to idle connections."""
        for conn in self.conns:
            if not conn.closed and conn.call is None:
                conn.transport.close()

    def open_connections(self) -> int:
        return sum(not conn.closed for conn in self.conns)

    def on_request(self, conn: EngineConn, body: dict[str, Any]) -> None:
        assert body["stream_options"]["include_usage"] is True
        _, mode, rid_text = body["messages"][0]["content"].split()
        rid = int(rid_text)
        self.received[rid] += 1
        self.conn_of[rid] = conn
        call = Call(rid, mode, int(body["max_tokens"]), self.rng.randint(1, 3), self.pad)
        conn.call = call
        write = conn.transport.write
        if mode == "stall_head":
            return
        if mode == "head_then_close":
            write(HEAD)
            conn.transport.close()
            return
        write(HEAD + chunk(ROLE))
        if mode == "bad_chunk_size":
            write(chunk(token(0)) + b"zz\r\nhello\r\n")
        elif mode == "bad_chunk_crlf":  # the CRLF after a chunk's data is something else
            first = token(0)
            write(b"%x\r\n%bXY" % (len(first), first) + chunk(token(1)) + tail(rid, 2))
        elif mode == "stall_body":
            write(chunk(token(0)) + chunk(token(1)))
        elif mode == "big":
            self.pump_big(conn)
        else:
            self.active.add(conn)

    def _finish(self, conn: EngineConn) -> bytes:
        call = conn.call
        assert call is not None
        conn.call = None
        self.active.discard(conn)
        self.completed += 1
        return tail(call.rid, call.tokens)

    def pump_big(self, conn: EngineConn) -> None:
        """Large events as fast as the engine's socket takes them (its backpressure honoured)."""
        call = conn.call
        while call is not None and not conn.paused and not conn.closed:
            data = chunk(token(call.sent, call.pad))
            call.sent += 1
            if call.sent == call.tokens:
                data += self._finish(conn)
                call = None
            conn.transport.write(data)

    def step(self) -> None:
        for conn in list(self.active):
            call = conn.call
            if call is None or conn.paused:
                continue
            n = min(call.per_write, call.tokens - call.sent)
            data = b"".join(chunk(token(call.sent + i)) for i in range(n))
            call.sent += n
            if call.sent == call.tokens:
                data += self._finish(conn)
            conn.transport.write(data)
        self._ticker = asyncio.get_running_loop().call_later(self.step_s, self.step)


@contextlib.asynccontextmanager
async def running_engine(step_s: float = 0.002, pad: int = 0) -> AsyncIterator[SoakEngine]:
    engine = SoakEngine(step_s, pad)
    await engine.start()
    try:
        yield engine
    finally:
        engine.stop()


# -- the sidecar --------------------------------------------------------------------------------


@dataclass
class Sidecar:
    url: str
    state: SidecarState
    runner: web.AppRunner

    def client_write_buffers(self) -> list[int]:
        """Bytes waiting in the sidecar's user-space write buffers, per client connection, and
        per stream the C relay holds for its client."""
        server = self.runner.server
        assert server is not None
        native = self.state.relay.native
        return [
            handler.transport.get_write_buffer_size()
            for handler in server.connections
            if handler.transport is not None
        ] + (native.unsent_bytes() if native is not None else [])

    def outcomes(self) -> Counter[str]:
        return self._counted(self.state.metrics.requests, names.OUTCOME)

    def tokens(self) -> Counter[str]:
        return self._counted(self.state.metrics.tokens, names.KIND)

    @staticmethod
    def _counted(counter: Any, label: str) -> Counter[str]:
        counts: Counter[str] = Counter()
        for metric in counter.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels[label]] += int(sample.value)
        return counts

    def settled(self) -> bool:
        scheduler = self.state.dispatcher.scheduler
        return scheduler.running == 0 and scheduler.queued == 0


@contextlib.asynccontextmanager
async def running_sidecar(engine_url: str, **settings: object) -> AsyncIterator[Sidecar]:
    base = SidecarSettings(
        engine_url=engine_url,
        admin_token=ADMIN_TOKEN,
        interaction_secret=SECRET,
        telemetry_interval_s=0.05,
        relay=relay_under_test(),
    )
    app = build_app(replace(base, **settings), fairness_config())  # type: ignore[arg-type]
    async with serve(app) as served:
        yield Sidecar(served.url, app[STATE], served.runner)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- clients ------------------------------------------------------------------------------------


@dataclass
class Result:
    rid: int
    status: int = 0
    parts: list[bytes] = field(default_factory=list)
    tokens: int = 0
    complete: bool = False
    """The whole response arrived (the last chunk, or the whole Content-Length body)."""
    aborted: bool = False

    @property
    def body(self) -> bytes:
        return b"".join(self.parts)

    def events(self) -> list[bytes]:
        return [e for e in self.body.split(b"\n\n") if e]

    @property
    def usage(self) -> dict[str, Any] | None:
        for event in self.events():
            if b'"usage":{' in event:
                found: dict[str, Any] = json.loads(event.removeprefix(b"data: "))["usage"]
                return found
        return None

    @property
    def error(self) -> dict[str, Any] | None:
        """The OpenAI error: the JSON body of an error status, or a stream's error event."""
        if self.status != 200:
            return cast(dict[str, Any], json.loads(self.body)["error"])
        for event in self.events():
            if event.startswith(b'data: {"error"'):
                return cast(dict[str, Any], json.loads(event.removeprefix(b"data: "))["error"])
        return None

    @property
    def done(self) -> bool:
        return b"data: [DONE]\n\n" in self.body


class Client(asyncio.Protocol):
    """Sends one request; decodes the response; aborts at token `abort_at`; can stall and drip."""

    def __init__(
        self, request: bytes, result: Result, abort_at: int | None, stall_s: float, drip_s: float
    ) -> None:
        self.request = request
        self.result = result
        self.abort_at = abort_at
        self.stall_s, self.drip_s = stall_s, drip_s
        self.buf = b""
        self.head = True
        self.chunked = False
        self.left = 0
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future[Result] = self.loop.create_future()
        self.transport = cast(asyncio.Transport, None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(self.result)

    def _pause(self, seconds: float) -> None:
        self.transport.pause_reading()
        self.loop.call_later(seconds, self._resume)

    def _resume(self) -> None:
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        result = self.result
        if self.head:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            self.buf = self.buf[end + 4 :]
            self.head = False
            result.status = int(lines[0].split()[1])
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)
            }
            self.chunked = headers.get("transfer-encoding") == "chunked"
            self.left = int(headers.get("content-length", "0"))
            if self.stall_s:
                self._pause(self.stall_s)
        if self.chunked:
            self._chunks()
        else:
            result.parts.append(self.buf)
            self.left -= len(self.buf)
            self.buf = b""
            result.complete = self.left <= 0
        if self.abort_at is not None and result.tokens >= self.abort_at:
            result.aborted = True  # even if the rest arrived in the same read
            self.transport.abort()
            self._finish()
        elif result.complete:
            self.transport.close()
            self._finish()
        elif self.drip_s:
            self._pause(self.drip_s)

    def _chunks(self) -> None:
        buf, pos, result = self.buf, 0, self.result
        while (eol := buf.find(b"\r\n", pos)) >= 0:
            size = int(buf[pos:eol], 16)
            if size == 0:
                result.complete = len(buf) >= eol + 4
                break
            if len(buf) < eol + 4 + size:
                break
            data = buf[eol + 2 : eol + 2 + size]
            assert buf[eol + 2 + size : eol + 4 + size] == b"\r\n"
            result.parts.append(data)
            result.tokens += data.count(b'"content":"t')
            pos = eol + 4 + size
        self.buf = buf[pos:]


async def call(
    url: str,
    mode: str,
    rid: int,
    max_tokens: int,
    *,
    usage: bool = False,
    abort_at: int | None = None,
    stall_s: float = 0.0,
    drip_s: float = 0.0,
    rcvbuf: int | None = None,
) -> Result:
    """One streamed chat completion through the sidecar."""
    body: dict[str, Any] = {
        "model": "stub-model",
        "messages": [{"role": "user", "content": f"soak {mode} {rid}"}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    if usage:
        body["stream_options"] = {"include_usage": True}
    payload = json.dumps(body).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(payload), payload)
    )
    host, port = url.removeprefix("http://").split(":")
    loop = asyncio.get_running_loop()
    result = Result(rid)
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, (host, int(port)))
    except BaseException:
        sock.close()
        raise
    transport, client = await loop.create_connection(
        lambda: Client(request, result, abort_at, stall_s, drip_s), sock=sock
    )
    try:
        return await client.done
    finally:
        transport.close()


def expect_complete(result: Result, tokens: int, usage: bool = False) -> None:
    assert result.status == 200, result.body[:300]
    assert result.complete, result.body[-300:]
    assert result.done, result.body[-300:]
    assert result.error is None, result.error
    assert result.tokens == tokens
    assert result.usage == (usage_of(result.rid, tokens) if usage else None)


def expect_error(result: Result, code: str) -> None:
    """A clear OpenAI-style error: an error status before the first byte, else an error event."""
    assert result.complete, f"the response did not end: {result.body[-300:]!r}"
    error = result.error
    assert error is not None, result.body[-300:]
    assert error["code"] == code, error
    assert not result.done


# -- 1. many streams, a random subset leaving mid-stream ----------------------------------------


@pytest.mark.timeout(300)
async def test_soak_many_streams_with_random_disconnects() -> None:
    rng = random.Random(20261122)
    requests, concurrency = 4000, 96
    specs = []
    for rid in range(requests):
        max_tokens = rng.randint(2, 24)
        leaves = rng.random() < 0.3
        specs.append(
            (
                rid,
                max_tokens,
                rng.random() < 0.5,
                rng.randint(1, max_tokens - 1) if leaves else None,
            )
        )
    async with running_engine() as engine, running_sidecar(engine.url) as sidecar:
        expect_complete(await call(sidecar.url, "ok", WARM_ID, 3), 3)
        engine.close_idle()
        await eventually(lambda: engine.open_connections() <= 1, 10)  # the telemetry poller's
        fds_before = open_fds()
        gate = asyncio.Semaphore(concurrency)

        async def one(rid: int, max_tokens: int, usage: bool, abort_at: int | None) -> Result:
            async with gate:
                return await call(
                    sidecar.url, "ok", rid, max_tokens, usage=usage, abort_at=abort_at
                )

        results = await asyncio.wait_for(asyncio.gather(*(one(*s) for s in specs)), 240)

        # Every request reached the engine exactly once.
        ids = {rid for rid in engine.received if rid < WARM_ID}
        assert ids == set(range(requests))
        assert [rid for rid, n in engine.received.items() if n != 1] == []
        # Every stream not left by its client is whole, with its usage when asked for.
        left = 0
        for (rid, max_tokens, usage, abort_at), result in zip(specs, results, strict=True):
            assert result.rid == rid
            if abort_at is None:
                expect_complete(result, max_tokens, usage)
            else:
                assert result.aborted
                assert result.tokens >= abort_at
                left += 1
        # The sidecar settles every request once; the engine learns of every stream dropped.
        await eventually(sidecar.settled, 30)
        await eventually(lambda: not engine.active, 30)
        outcomes = sidecar.outcomes()
        assert sum(outcomes.values()) == requests + 1, outcomes
        assert set(outcomes) <= {"served", "cancelled"}, outcomes
        assert outcomes["served"] >= requests - left
        assert outcomes["cancelled"] <= left
        assert engine.completed + engine.dropped == requests + 1
        assert engine.completed >= outcomes["served"]
        assert engine.dropped <= outcomes["cancelled"]
        # Exact usage settles the token counters of the served requests.
        whole = [s for s in specs if s[3] is None]
        tokens = sidecar.tokens()
        assert tokens["output"] >= sum(s[1] for s in whole) + 3
        assert tokens["input"] >= sum(prompt_tokens(s[0]) for s in whole)
        assert sidecar.state.metrics.in_flight_now._value.get() == 0
        # No connection or descriptor is left behind once the engine drops its idle ones.
        assert engine.open_connections() <= concurrency + 1
        engine.close_idle()
        await eventually(lambda: engine.open_connections() <= 1, 10)
        await eventually(lambda: open_fds() <= fds_before + 2, 10)


# -- 2. the engine restarts under running streams and idle pooled connections -------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("idle", ["closed", "left_open"])
async def test_engine_restart_ends_running_streams_and_later_requests_succeed(idle: str) -> None:
    """`closed`: the old engine closes its idle connections as it goes; `left_open`: they stay
    open and close when a request arrives on them unanswered (the race of a keep-alive timeout,
    or a shutdown, with a reused connection)."""
    async with running_engine(step_s=0.01) as engine, running_sidecar(engine.url) as sidecar:
        warm = await asyncio.gather(*(call(sidecar.url, "ok", WARM_ID + i, 2) for i in range(32)))
        for result in warm:
            expect_complete(result, 2)
        running = [
            asyncio.create_task(call(sidecar.url, "ok", i, 100_000, usage=True)) for i in range(16)
        ]
        await eventually(lambda: len(engine.active) == 16, 10, 0.01)
        await eventually(lambda: all(c.call and c.call.sent >= 2 for c in engine.active), 10)
        engine.stop(leave_idle_open=idle == "left_open")
        await engine.start()

        for result in await asyncio.wait_for(asyncio.gather(*running), 30):
            assert result.status == 200
            assert result.tokens >= 2
            expect_error(result, "engine_error")

        for wave in range(3):
            after = await asyncio.gather(
                *(call(sidecar.url, "ok", 100 + 32 * wave + i, 3, usage=True) for i in range(32))
            )
            statuses = Counter(r.status for r in after)
            assert statuses == {200: 32}, (wave, statuses, [r.body[:200] for r in after])
            for result in after:
                expect_complete(result, 3, usage=True)
        assert [rid for rid, n in engine.received.items() if n != 1] == []
        if idle == "left_open":
            assert engine.rejected > 0, "no request met a stale pooled connection"
        await eventually(sidecar.settled, 10)


# -- 3. an engine that breaks the response --------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("mode", "code"),
    [
        ("head_then_close", "engine_error"),
        ("bad_chunk_size", "engine_error"),
        ("bad_chunk_crlf", "engine_error"),
        ("stall_body", "engine_timeout"),
        ("stall_head", "engine_timeout"),
    ],
)
async def test_a_broken_response_is_a_clear_error_and_its_connection_is_dropped(
    mode: str, code: str
) -> None:
    async with running_engine() as engine:
        async with running_sidecar(engine.url, engine_idle_timeout_s=1.0) as sidecar:
            # A pooled connection first: the broken response comes on it or on a new one.
            expect_complete(await call(sidecar.url, "ok", WARM_ID, 3), 3)
            result = await asyncio.wait_for(call(sidecar.url, mode, 1, 5), 20)
            expect_error(result, code)
            broken = engine.conn_of[1]
            await eventually(lambda: broken.closed, 10, 0.01)
            for rid in (2, 3):
                expect_complete(await call(sidecar.url, "ok", rid, 3), 3)
                assert engine.conn_of[rid] is not broken
            await eventually(sidecar.settled, 10)
            outcomes = sidecar.outcomes()
            assert outcomes["served"] == 3
            assert outcomes["timeout" if code == "engine_timeout" else "engine_error"] == 1
            assert sum(outcomes.values()) == 4, outcomes
            assert [rid for rid, n in engine.received.items() if n != 1] == []


# -- 4. a slow client while the engine streams fast ---------------------------------------------


def _write_buffer_bound() -> int:
    """Most a relay leaves in the client's write buffer: its pause threshold, plus what one read
    of the engine's socket (asyncio reads up to 256 KiB) can add after it, plus the read that the
    aiohttp relay's own reader may still hold, plus one event's framing."""
    try:
        high = importlib.import_module("fleetwarden.sidecar.stream")._HIGH_WATER
    except ImportError:  # the aiohttp relay: it drains above this
        high = importlib.import_module("fleetwarden.sidecar.relay")._DRAIN_ABOVE
    read = 256 * 1024
    return int(high) + 2 * read + 8 * 1024


@pytest.mark.timeout(120)
async def test_a_slow_client_holds_the_engine_back_and_memory_stays_bounded() -> None:
    tokens, pad = 4000, 4000  # 16 MB: more than the kernel buffers between sidecar and client
    async with running_engine(pad=pad) as engine, running_sidecar(engine.url) as sidecar:
        peak = 0

        def sample() -> None:
            nonlocal peak
            peak = max(peak, *sidecar.client_write_buffers(), 0)

        sampler = asyncio.get_running_loop().create_task(_every(0.002, sample))
        try:
            slow = asyncio.create_task(
                call(sidecar.url, "big", 1, tokens, stall_s=1.5, drip_s=0.003, rcvbuf=64 * 1024)
            )
            result = await asyncio.wait_for(slow, 90)
        finally:
            sampler.cancel()
        expect_complete(result, tokens)
        for rid in (2, 3):  # on the connection the slow stream paused, now back in the pool
            expect_complete(await asyncio.wait_for(call(sidecar.url, "ok", rid, 3), 20), 3)
        # Above zero: the kernel's buffers to the client were full and the sidecar had to hold
        # bytes itself (without backpressure it would hold most of the 16 MB).
        assert 0 < peak <= _write_buffer_bound(), (peak, _write_buffer_bound())
        assert engine.conn_of[1].paused_count > 0


async def _every(interval_s: float, action: Callable[[], None]) -> None:
    while True:
        action()
        await asyncio.sleep(interval_s)


@pytest.mark.timeout(60)
async def test_a_client_slower_than_the_idle_timeout_is_not_an_engine_timeout() -> None:
    """The engine's idle timeout measures the engine, not a client that holds it back."""
    tokens, pad = 4000, 4000
    async with running_engine(pad=pad) as engine:
        async with running_sidecar(engine.url, engine_idle_timeout_s=0.5) as sidecar:
            result = await asyncio.wait_for(
                call(sidecar.url, "big", 1, tokens, stall_s=2.0, rcvbuf=64 * 1024), 30
            )
            expect_complete(result, tokens)
            await eventually(sidecar.settled, 10)
            assert sidecar.outcomes() == {"served": 1}
