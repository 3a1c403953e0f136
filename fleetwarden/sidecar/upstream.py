"""The sidecar's HTTP/1.1 client to its engine: an asyncio Protocol with a keep-alive pool.

Why not aiohttp's client here: a streamed completion is one HTTP chunk per token, and aiohttp's
client re-enters its parser, its stream reader and the relaying coroutine for each of them (about
40% of the relay's CPU in the profile of `docs/performance.md`). Here the engine's bytes are
decoded from chunked framing in `data_received` and handed synchronously to a `BodySink`, so the
relay runs as a plain callback per socket read, with no task switch per token. It is one request
per connection at a time (no pipelining), connections are reused while the engine keeps them
alive, and a reused connection that dies before the first response byte is retried once on a
fresh one (the engine closed it while idle, so it never saw the request).

A connection belongs to the caller of `EnginePool.request` until that caller gives it back with
`EnginePool.release`, which pools it if its response ended cleanly and aborts it otherwise (how
the engine learns that a client left). Nothing else returns a connection to the pool: the
connection's own callbacks see the body end before its owner has resumed, and a connection
pooled there could be lent to a second request, which the first owner's cleanup then aborted
(the lockstep bench hung that way whenever streams ended together).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from typing import Protocol, cast
from urllib.parse import urlsplit

_MAX_HEAD = 64 * 1024
_MAX_CHUNK_LINE = 4 * 1024
"""Longest chunk-size line (size and extensions) accepted before its CRLF."""
_KEEP_IDLE_S = 2.0
"""Idle connections older than this are not reused: engines (uvicorn: 5 s) close them first."""


class EngineTimeoutError(TimeoutError):
    """No response head, or no byte of a streaming body, within the timeout."""


class EngineClosedError(ConnectionError):
    """The engine closed the connection or sent something that is not HTTP/1.1."""


class BodySink(Protocol):
    """Receives a response body as it is decoded (called from the connection's callbacks)."""

    def on_body(self, data: bytes) -> None: ...

    def on_end(self) -> None: ...

    def on_error(self, exc: Exception) -> None: ...


class Collect:
    """A sink that keeps the whole body (non-streaming responses, error bodies)."""

    def __init__(self, limit: int | None = None) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.limit = limit
        self.done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def on_body(self, data: bytes) -> None:
        if self.limit is None or self.size < self.limit:
            self.parts.append(data)
            self.size += len(data)

    def on_end(self) -> None:
        if not self.done.done():
            body = b"".join(self.parts)
            self.done.set_result(body if self.limit is None else body[: self.limit])

    def on_error(self, exc: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(exc)


class EngineConnection(asyncio.Protocol):
    """One connection; parses one response at a time and feeds its body to `sink`."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.leased = False
        """Lent out by `EnginePool.request` and not released yet."""
        self.idle_since = 0.0
        self._head: asyncio.Future[tuple[int, dict[str, str]]] | None = None
        self._buf = b""
        self._in_head = False
        self._chunked = False
        self._left = -1
        """Body bytes still due (Content-Length), or of the current chunk; -1: until close."""
        self._crlf = False
        """A chunk's payload ended: its CRLF is due next."""
        self._keep_alive = True
        self._until_close = False
        self.got_bytes = False
        self.complete = False
        self.sink: BodySink | None = None
        self._early: list[bytes] = []
        self._timeout_s = 0.0
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False
        """Reading paused for a slow client: the idle timeout does not run meanwhile."""

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        if self._until_close and not self._in_head and not self.complete:
            self._finish()  # a body delimited by the end of the connection
        elif not self.complete and (self._head is not None or self.sink is not None):
            self._fail(EngineClosedError("the engine closed the connection mid-response"))

    def data_received(self, data: bytes) -> None:
        self._last = self._loop.time()
        self.got_bytes = True
        if self.complete:  # bytes after the response (or while idle): not HTTP we can follow
            self._keep_alive = False
            return
        if self._in_head:
            self._buf += data
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > _MAX_HEAD:
                    self._fail(EngineClosedError("response head too large"))
                return
            head, data = self._buf[:end], self._buf[end + 4 :]
            self._buf = b""
            self._in_head = False
            if not self._parse_head(head):
                return
            if not data and not self.complete:
                return
        if self._chunked:
            self._feed_chunked(data)
        elif data:
            if self._left >= 0:
                data = data[: self._left]
                self._left -= len(data)
            self._deliver(data)
            if self._left == 0:
                self._finish()

    # -- requests -----------------------------------------------------------------------------

    async def request(
        self, head: bytes, body: bytes, timeout_s: float
    ) -> tuple[int, dict[str, str]]:
        """Send one request; its status and headers (lower-cased names) once they arrived."""
        assert self.transport is not None
        assert self.sink is None
        self._head = self._loop.create_future()
        self._in_head, self._buf, self.complete = True, b"", False
        self.got_bytes = False
        self.sink, self._early = None, []
        self._timeout_s, self._last = timeout_s, self._loop.time()
        self._stop_timer()
        self._timer = self._loop.call_at(self._last + timeout_s, self._check_timeout)
        self.transport.write(head + body)
        return await self._head

    def attach(self, sink: BodySink, timeout_s: float) -> None:
        """Feed the body to `sink` from now on (what arrived with the head first)."""
        self._timeout_s = timeout_s
        self.sink = sink
        early, self._early = self._early, []
        for data in early:
            sink.on_body(data)
        if self.complete:
            self.sink = None
            sink.on_end()
        elif self.closed:
            sink.on_error(EngineClosedError("the engine closed the connection mid-response"))

    def pause_reading(self) -> None:
        """Stop reading the engine (its client is slow); its idle timeout stops with it, since
        that measures the engine, not a client holding it back."""
        self._paused = True
        self._stop_timer()
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        """Read again, and time the engine again from now on."""
        self._paused = False
        if self.transport is None or self.closed:
            return
        if not self.transport.is_reading():
            self.transport.resume_reading()
        if not self.complete and self._timer is None and self._timeout_s > 0:
            self._last = self._loop.time()
            self._timer = self._loop.call_at(self._last + self._timeout_s, self._check_timeout)

    def abort(self) -> None:
        """Drop the connection (the engine then cancels the request)."""
        self.sink = None
        self._stop_timer()
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True

    # -- parsing ------------------------------------------------------------------------------

    def _parse_head(self, head: bytes) -> bool:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            self._fail(EngineClosedError(f"not an HTTP/1.x response: {lines[0][:80]!r}"))
            return False
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        connection = headers.get("connection", "").lower()
        self._keep_alive = parts[0] == "HTTP/1.1" and "close" not in connection
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._left = -1
        self._crlf = False
        self._until_close = False
        if self._chunked:
            self._left = 0
        elif "content-length" in headers:
            try:
                self._left = max(0, int(headers["content-length"]))
            except ValueError:
                self._fail(EngineClosedError("bad Content-Length"))
                return False
        elif status in (204, 304) or 100 <= status < 200:
            self._left = 0
        else:
            self._keep_alive = False
            self._until_close = True
        future, self._head = self._head, None
        if future is not None and not future.done():
            future.set_result((status, headers))
        if self._left == 0 and not self._chunked:
            self._finish()
        return True

    def _feed_chunked(self, data: bytes) -> None:
        """Decode chunked framing; the usual read is exactly one whole chunk (fast path)."""
        if not self._buf and not self._left and not self._crlf:
            eol = data.find(b"\r\n")
            if eol > 0:
                size = _chunk_size(data[:eol])
                if size > 0 and len(data) == eol + size + 4 and data.endswith(b"\r\n"):
                    self._deliver(data[eol + 2 : -2])
                    return
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        pos, end = 0, len(buf)
        while pos < end or self._crlf:
            if self._left > 0:
                take = min(self._left, end - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self._left -= take
                if self._left:
                    break
                self._crlf = True
            if self._crlf:
                if end - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    self._fail(EngineClosedError("bad chunk framing: no CRLF after a chunk"))
                    return
                pos += 2
                self._crlf = False
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if end - pos > _MAX_CHUNK_LINE:
                    self._fail(EngineClosedError("chunk-size line too long"))
                    return
                break
            size = _chunk_size(buf[pos:eol])
            if size < 0:
                self._fail(EngineClosedError("bad chunk size"))
                return
            if size == 0:
                if buf.startswith(b"\r\n", eol + 2):
                    trailer_end = eol + 2
                else:  # trailer fields, ended by an empty line
                    trailer_end = buf.find(b"\r\n\r\n", eol + 2)
                    if trailer_end >= 0:
                        trailer_end += 2
                if trailer_end < 0:
                    break  # the last chunk's trailers are not complete yet
                if trailer_end + 2 < end:  # bytes after the response: not HTTP we can follow
                    self._keep_alive = False
                pos = end
                if out:
                    self._deliver(b"".join(out))
                    out = []
                self._finish()
                break
            self._left = size
            pos = eol + 2
        self._buf = buf[pos:]
        if out:
            self._deliver(out[0] if len(out) == 1 else b"".join(out))

    def _deliver(self, data: bytes) -> None:
        sink = self.sink
        if sink is not None:
            sink.on_body(data)
        else:
            self._early.append(data)

    def _finish(self) -> None:
        self.complete = True
        self._stop_timer()
        sink = self.sink
        if sink is not None:
            self.sink = None
            sink.on_end()

    def _fail(self, exc: Exception) -> None:
        head, self._head = self._head, None
        if head is not None and not head.done():
            head.set_exception(exc)
        sink, self.sink = self.sink, None
        if sink is not None:
            sink.on_error(exc)
        self.abort()

    # -- timeouts -----------------------------------------------------------------------------

    def _check_timeout(self) -> None:
        """A lazy timer: re-armed for what is left since the last byte, never per byte."""
        self._timer = None
        if self.complete or self.closed or self._paused:
            return
        due = self._last + self._timeout_s
        if self._loop.time() >= due:
            self._fail(EngineTimeoutError("the inference engine did not answer in time"))
        else:
            self._timer = self._loop.call_at(due, self._check_timeout)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def reusable(self) -> bool:
        return self.complete and self._keep_alive and not self.closed


def _chunk_size(line: bytes) -> int:
    """The size on a chunk-size line (extensions ignored); -1 if it is not plain hex."""
    digits = line.split(b";", 1)[0]
    if not digits or digits.strip(b"0123456789abcdefABCDEF"):
        return -1
    return int(digits, 16)


class EnginePool:
    """Keep-alive connections to one engine; `request` sends a request on one of them."""

    def __init__(
        self, engine_url: str, *, connect_timeout_s: float, keep_idle_s: float = _KEEP_IDLE_S
    ) -> None:
        parts = urlsplit(engine_url)
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._tls else 80)
        self._authority = parts.netloc
        self._prefix = parts.path.rstrip("/")
        self._connect_timeout_s = connect_timeout_s
        self._keep_idle_s = keep_idle_s
        self._idle: list[EngineConnection] = []
        """Pooled connections, oldest first (`release` appends, `_reuse` takes the newest)."""

    async def _connect(self) -> EngineConnection:
        loop = asyncio.get_running_loop()
        context = ssl.create_default_context() if self._tls else None
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, protocol = await loop.create_connection(
                    EngineConnection, self._host, self._port, ssl=context
                )
        except TimeoutError:
            raise EngineTimeoutError("could not connect to the inference engine in time") from None
        return protocol

    def _reuse(self) -> EngineConnection | None:
        now = asyncio.get_running_loop().time()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and now - connection.idle_since < self._keep_idle_s:
                return connection
            connection.abort()
        return None

    def _sweep(self, now: float) -> None:
        """Close the pooled connections idle past the reuse window (the oldest, at the front).

        Without it, a burst's connections would stay open until a later burst reached them: an
        engine that keeps idle connections alive longer than uvicorn does would hold a socket
        per peak-concurrency stream.
        """
        idle = self._idle
        stale = 0
        while stale < len(idle) and (
            idle[stale].closed or now - idle[stale].idle_since >= self._keep_idle_s
        ):
            idle[stale].abort()
            stale += 1
        if stale:
            del idle[:stale]

    @property
    def idle_connections(self) -> int:
        """Connections waiting in the pool (for tests and the admin state)."""
        return len(self._idle)

    def release(self, connection: EngineConnection) -> None:
        """The owner is done with `connection`: pooled if its response ended, else aborted."""
        if not connection.leased:
            return
        connection.leased = False
        connection.sink = None
        now = asyncio.get_running_loop().time()
        self._sweep(now)
        if connection.reusable:
            connection.resume_reading()  # its last read may have paused it (a slow client)
            connection.idle_since = now
            self._idle.append(connection)
        else:
            connection.abort()

    def encode(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> bytes:
        lines = [f"{method} {self._prefix}{path} HTTP/1.1", f"Host: {self._authority}"]
        lines += [f"{k}: {v}" for k, v in headers.items() if "\r" not in v and "\n" not in v]
        lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")

    async def request(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes, timeout_s: float
    ) -> tuple[EngineConnection, int, dict[str, str]]:
        """Send a request; the connection (attach a sink to it for the body), status, headers.

        The caller owns the connection from here and must `release` it when done with it.
        """
        head = self.encode(method, path, headers, body)
        connection = self._reuse()
        if connection is not None:
            try:
                connection.leased = True
                status, response_headers = await connection.request(head, body, timeout_s)
                return connection, status, response_headers
            except EngineClosedError:
                if connection.got_bytes:
                    raise
                # closed while idle, before it saw the request: once more on a fresh one
            except BaseException:
                connection.abort()
                raise
        connection = await self._connect()
        connection.leased = True
        try:
            status, response_headers = await connection.request(head, body, timeout_s)
        except BaseException:
            connection.abort()
            raise
        return connection, status, response_headers

    def close(self) -> None:
        for connection in self._idle:
            connection.abort()
        self._idle.clear()
