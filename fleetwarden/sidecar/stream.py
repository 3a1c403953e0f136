"""The streaming relay's hot path: SSE bytes from the engine to the client, charged per read.

`StreamRelay` is a `BodySink` of `upstream.EngineConnection`, so it runs inside the socket
callback that received the engine's bytes: no coroutine, no task switch and no reader queue per
token. Everything complete in one read is forwarded in one write to the client's transport,
framed as one HTTP chunk (whole events only: an incomplete tail waits for the next read).

Tokens are counted by scanning bytes (`plain_tokens`) when a read holds only complete content
events; anything else takes the per-event path (`split_events`), which gives the same count and
decodes only the final usage chunk (dropped from the client's stream unless it asked for usage).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, Protocol

from fleetwarden.sidecar.dispatcher import Dispatcher
from fleetwarden.sidecar.flight import Flight
from fleetwarden.sidecar.metrics import SidecarMetrics

_DONE = b"data: [DONE]"
_HIGH_WATER = 256 * 1024
"""Client write buffer above which the engine's socket is paused (a slow client)."""
_LOW_WATER = 64 * 1024
_RESUME_POLL_S = 0.005


class Pausable(Protocol):
    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class NotAnEventStreamError(Exception):
    """The engine answered a streamed call 200 but its body ended without one SSE event: a proxy
    page, a crash message. Relayed as a final error event, counted as an engine error."""

    def __init__(
        self, message: str = "the inference engine answered with a body that is not an event stream"
    ) -> None:
        super().__init__(message)


class BodyCounter(Protocol):
    """What the relay keeps of the response writer: its byte count (for the access log)."""

    output_size: int


def record_tokens(
    flight: Flight, observe_gap: Callable[[float], None], at: float, tokens: int
) -> None:
    """What the metrics keep of `tokens` token events read at `at`: the first-token time, the
    inter-token gap, the fluidity index. Both relays call it (the C relay with its read times)."""
    if flight.last_token_s is None:
        flight.first_token_s = at
    else:
        observe_gap(at - flight.last_token_s)
    flight.last_token_s = at
    fluidity = flight.fluidity
    if fluidity is not None:
        fluidity.on_tokens(at, tokens)


def frame(data: bytes, chunked: bool) -> bytes:
    """`data` as one HTTP chunk of the client's response (as it is for an HTTP/1.0 client)."""
    return b"%x\r\n%b\r\n" % (len(data), data) if chunked else data


def plain_tokens(data: bytes) -> int:
    """Token events in `data` when it holds only complete content events, else -1.

    The common read: no role, usage or `[DONE]` event and no incomplete tail, so it is
    forwarded as it is and its tokens are its events that start with `data:`, found by byte
    scans instead of splitting it (JSON strings cannot hold a raw newline, so `\\n\\ndata:`
    only occurs at an event boundary). Equal to `split_events` on such reads.
    """
    if (
        data.endswith(b"\n\n")
        and _DONE not in data
        and b'"role":"assistant"' not in data
        and b'"usage":{' not in data
        and b'"usage": {' not in data
    ):
        return data.startswith(b"data:") + data.count(b"\n\ndata:")
    return -1


def read_usage_event(event: bytes) -> tuple[dict[str, Any] | None, bool]:
    """An event that mentions a usage object: the usage (None if it is not a JSON object), and
    whether the event is the engine's usage chunk (a JSON object without choices), which is not a
    token and reaches the client only if it asked for usage. Unparseable JSON counts as a usage
    chunk. Both relays ask this (the C relay through `NativeStream.on_usage_event`)."""
    try:
        chunk = json.loads(event[event.index(b"{") :])
    except (ValueError, RecursionError):  # RecursionError: an engine's nested junk
        chunk = {}
    if not isinstance(chunk, dict):
        return None, False
    found = chunk.get("usage")
    return (found if isinstance(found, dict) else None), not chunk.get("choices")


def split_events(
    pending: bytes, client_wants_usage: bool
) -> tuple[bytes, bytes, dict[str, Any] | None, int]:
    """Complete events of `pending` to forward, the incomplete rest, a usage if seen, and the
    number of token events among them (the role-only opening event and the usage chunk are not
    tokens). The per-event path, for reads that are not only complete content events."""
    out: list[bytes] = []
    usage: dict[str, Any] | None = None
    tokens = 0
    start = 0
    while (end := pending.find(b"\n\n", start)) >= 0:
        event = pending[start : end + 2]
        start = end + 2
        if event.startswith(_DONE):
            out.append(event)
            continue
        if b'"usage":{' in event or b'"usage": {' in event:
            found, usage_chunk = read_usage_event(event)
            if found is not None:
                usage = found
            if usage_chunk:
                if client_wants_usage:
                    out.append(event)
                continue
        if event.startswith(b"data:") and not (
            b'"role":"assistant"' in event and b'"content":""' in event
        ):
            tokens += 1
        out.append(event)
    return b"".join(out), pending[start:], usage, tokens


class StreamRelay:
    """Relays one streamed response; `done` resolves when the engine's stream ended or failed,
    or the client left (`client_gone`)."""

    def __init__(
        self,
        flight: Flight,
        dispatcher: Dispatcher,
        metrics: SidecarMetrics,
        client: asyncio.WriteTransport,
        writer: BodyCounter,
        chunked: bool,
        upstream: Pausable,
    ) -> None:
        self.flight = flight
        self._request = flight.request
        self._wants_usage = flight.call.client_wants_usage
        self._clock = dispatcher.clock
        self._charge = dispatcher.scheduler.on_output
        self._observe_gap = metrics.inter_token_now.observe
        self._client = client
        self._writer = writer
        self._chunked = chunked
        self._upstream = upstream
        """The engine's transport: paused while the client's buffer is full."""
        self._pending = b""
        self._seen_event = False
        """Whether a `data:` event was forwarded: a 200 body without one is not a stream."""
        self.usage: dict[str, Any] | None = None
        self.error: Exception | None = None
        self.client_gone = False
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_body(self, data: bytes) -> None:
        if self.client_gone:
            return  # nobody reads them: not relayed, so neither charged nor counted
        if self._pending:
            data, self._pending = self._pending + data, b""
        tokens = plain_tokens(data)
        if tokens < 0:
            data, self._pending, usage, tokens = split_events(data, self._wants_usage)
            if usage is not None:
                self.usage = usage
        if tokens:
            self._on_tokens(tokens)
        if data:
            if not self._seen_event:
                self._seen_event = data.startswith(b"data:") or b"\ndata:" in data
            self._write(data)

    def _on_tokens(self, tokens: int) -> None:
        now = self._clock()
        record_tokens(self.flight, self._observe_gap, now, tokens)
        self._charge(self._request, tokens, now)

    def _write(self, data: bytes) -> None:
        client = self._client
        if client.is_closing():
            self._client_left()
            return
        data = frame(data, self._chunked)
        client.write(data)
        self._writer.output_size += len(data)
        if client.get_write_buffer_size() > _HIGH_WATER:
            self._upstream.pause_reading()
            asyncio.get_running_loop().call_later(_RESUME_POLL_S, self._maybe_resume)

    def _maybe_resume(self) -> None:
        if self.done.done():
            return
        if self._client.is_closing():
            self._client_left()
        elif self._client.get_write_buffer_size() <= _LOW_WATER:
            self._upstream.resume_reading()
        else:
            asyncio.get_running_loop().call_later(_RESUME_POLL_S, self._maybe_resume)

    def _client_left(self) -> None:
        self.client_gone = True
        if not self.done.done():
            self.done.set_result(None)

    def on_end(self) -> None:
        if not self._seen_event and self.error is None:
            # Even `data: [DONE]` alone is an event; garbage is not, and ending it as an empty
            # 200 stream would tell the client (and the metrics) that all went well.
            self.error = NotAnEventStreamError()
        if not self.done.done():
            self.done.set_result(None)

    def on_error(self, exc: Exception) -> None:
        self.error = exc
        if not self.done.done():
            self.done.set_result(None)

    def write_error(self, message: bytes) -> None:
        """A failure after the first byte: a final error event (the status line is gone)."""
        if not self._client.is_closing():
            self._write(b"data: " + message + b"\n\n")


__all__ = [
    "NotAnEventStreamError",
    "StreamRelay",
    "frame",
    "plain_tokens",
    "read_usage_event",
    "record_tokens",
    "split_events",
]
