"""The sidecar's HTTP/1.1 client connection to its engine: an asyncio Protocol.

Why not aiohttp's client here: a streamed completion is one HTTP chunk per token, and aiohttp's
client re-enters its parser, its stream reader and the relaying coroutine for each of them (about
40% of the relay's CPU in the profile of `docs/performance.md`). Here the engine's bytes are
decoded from chunked framing in `data_received` and handed synchronously to a `BodySink`, so the
relay runs as a plain callback per socket read, with no task switch per token. It is one request
per connection at a time (no pipelining), connections are reused while the engine keeps them
alive (`engine_pool.EnginePool`), and a reused connection that dies before the first response
byte is retried once on a fresh one (the engine closed it while idle, so it never saw the
request). A streamed 200 may instead be held undecoded for the C relay (`hold_body`).
"""

from __future__ import annotations

import asyncio
from typing import Protocol, cast

_MAX_HEAD = 64 * 1024
_MAX_CHUNK_LINE = 4 * 1024
"""Longest chunk-size line (size and extensions) accepted before its CRLF."""


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
        self._hold_wanted = False
        self._status = 0
        self.held_body: bytes | None = None
        """The raw bytes after a chunked 200 head, kept undecoded for the C relay
        (`request(hold_body=True)`); the socket is paused meanwhile. None: not held."""

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
        if self.held_body is not None:  # read before the pause took effect: kept in order
            self.held_body += data
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
            if self._hold_wanted and self._chunked and self._status == 200:
                self._hold(data)
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
        self, head: bytes, body: bytes, timeout_s: float, *, hold_body: bool = False
    ) -> tuple[int, dict[str, str]]:
        """Send one request; its status and headers (lower-cased names) once they arrived.

        `hold_body`: a chunked 200's body is not decoded but held for the C relay
        (`held_body`, then `take_held` or `decode_held`)."""
        assert self.transport is not None
        assert self.sink is None
        self._hold_wanted, self.held_body = hold_body, None
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

    def _hold(self, data: bytes) -> None:
        self.held_body = data
        self._stop_timer()  # the C relay times the engine from here
        if self.transport is not None:
            self.transport.pause_reading()

    def take_held(self) -> bytes:
        """The held body bytes, for the C relay, which reads the socket from here until
        `end_hand_off`."""
        held, self.held_body = self.held_body or b"", None
        self._hold_wanted = False
        return held

    def decode_held(self) -> None:
        """No C relay after all: decode the held bytes and read on, as without `hold_body`."""
        held = self.take_held()
        if held:
            self._feed_chunked(held)
        if not self.closed and not self.complete:
            self.resume_reading()

    def end_hand_off(self, clean_end: bool) -> None:
        """The C relay is done with the socket: the response ended cleanly (and nothing followed
        it), or the connection must not be reused."""
        if clean_end:
            self.complete = True
        else:
            self._keep_alive = False

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
        status = self._status = int(parts[1])
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
