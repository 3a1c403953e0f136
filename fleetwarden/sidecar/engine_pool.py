"""A keep-alive pool of `EngineConnection`s to one engine, lent one request at a time.

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
from urllib.parse import urlsplit

from fleetwarden.sidecar.upstream import EngineClosedError, EngineConnection, EngineTimeoutError

_KEEP_IDLE_S = 2.0
"""Idle connections older than this are not reused: engines (uvicorn: 5 s) close them first."""


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
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        timeout_s: float,
        *,
        hold_body: bool = False,
    ) -> tuple[EngineConnection, int, dict[str, str]]:
        """Send a request; the connection (attach a sink to it for the body), status, headers.

        The caller owns the connection from here and must `release` it when done with it.
        `hold_body`: see `EngineConnection.request`.
        """
        head = self.encode(method, path, headers, body)
        connection = self._reuse()
        if connection is not None:
            try:
                connection.leased = True
                status, response_headers = await connection.request(
                    head, body, timeout_s, hold_body=hold_body
                )
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
            status, response_headers = await connection.request(
                head, body, timeout_s, hold_body=hold_body
            )
        except BaseException:
            connection.abort()
            raise
        return connection, status, response_headers

    def close(self) -> None:
        for connection in self._idle:
            connection.abort()
        self._idle.clear()
