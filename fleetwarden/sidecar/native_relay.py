"""Streamed responses relayed in C (`_fastrelay.c`), every decision and count kept in Python.

Why: relaying a token costs the Python relay about 20 us of CPU on the event loop beyond the
kernel's share, and every new request waits behind those events: at 256 streams that was most of
the sidecar's added first-token latency (docs/performance.md, "The native relay"). Here the body
of a streamed completion, after its head, goes from the engine's socket to the client's in C, on
a thread of the relay's own that never holds the GIL (docs/performance.md, "The relay thread");
the event loop wakes, through `Relay.fileno()`, for streams that ended, usage events and the
2 ms charges, not once per token.

What stays in Python, unchanged: admission, dispatch and the scheduler's charges (batched: the
token events the C relay saw are charged every `FLUSH_S`, at the charge's time), the metrics and
the fluidity index (replayed from the read times the C relay recorded, so the first-token time and
the gaps are those of the reads, not of the batch), the usage chunk's parsing (a usage event parks its
stream until `Relay.poll` has called `on_usage_event` on it), the settlement, and every error the client
sees.

The hand-off: `EngineConnection` stops at the head of a chunked 200 and pauses its socket, keeping
the body bytes that came with the head (`held_body`); aiohttp has written the client's response
head. With both transports' write buffers empty, the C relay works on duplicates of the two
sockets until the body ends, the client leaves or the engine fails; then it hands both back:
bytes the client had not taken yet go out through aiohttp's transport, `write_eof` ends the body,
and the engine connection is pooled if its response ended cleanly (aborted otherwise, which is how
the engine learns that a client left). Where a hand-off is not possible (TLS, a clock that is not
`time.monotonic`, a write still buffered, the extension not built) the Python relay runs instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from fleetwarden.fairness.request import Request
from fleetwarden.sidecar.flight import Flight
from fleetwarden.sidecar.stream import (
    BodyCounter,
    NotAnEventStreamError,
    frame,
    read_usage_event,
    record_tokens,
)
from fleetwarden.sidecar.upstream import EngineClosedError, EngineTimeoutError

if TYPE_CHECKING:  # the stub (`_fastrelay.pyi`) types every call into the C relay
    from fleetwarden.sidecar._fastrelay import Relay as CRelay
    from fleetwarden.sidecar._fastrelay import Stream as CStream

_fastrelay: ModuleType | None
try:
    from fleetwarden.sidecar import _fastrelay
except ImportError as exc:  # not built here (setup.py says why when it installs)
    _fastrelay = None
    NATIVE_MISSING: str | None = f"the C relay is not built ({exc})"
else:
    NATIVE_MISSING = None

RELAY_MODES = ("auto", "native", "python")
"""`--relay`: auto (the C relay where it can run, else Python), native (refuse to start without
it), python (the Python relay only)."""

RELAY_NICE = 19
"""The relay thread's default niceness: on a core it shares with the event loop it runs when the
loop does not, so a new request's admission is not held up by other streams' token events
(docs/performance.md, "The relay thread"); it takes what the loop leaves, which is most of it."""

FLUSH_S = 0.002
"""How long token events counted in C may wait to be charged: one wake-up charges every stream's
events since the last one, instead of one Python callback per token."""


class NativeRelayUnavailableError(RuntimeError):
    """`--relay native` where the C relay cannot run."""


class NativeStream:
    """One stream the C relay forwards; `done` resolves when it ended (as `StreamRelay.done`)."""

    def __init__(
        self,
        owner: NativeRelay,
        flight: Flight,
        client: asyncio.WriteTransport,
        writer: BodyCounter,
        chunked: bool,
        idle_timeout_s: float,
    ) -> None:
        self._owner = owner
        self.handle: Any = None  # the C stream (CStream) once begun
        """The C relay's `Stream`, set by `NativeRelay.start`."""
        self.flight = flight
        self._client = client
        self._writer = writer
        self._chunked = chunked
        self._idle_timeout_s = idle_timeout_s
        self.usage: dict[str, Any] | None = None
        self.error: Exception | None = None
        self.client_gone = False
        loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = loop.create_future()
        self._timer: asyncio.TimerHandle | None = None

    def begin(self, handle: CStream) -> None:
        """The C relay took the stream: time the engine from now on."""
        self.handle = handle
        if self._idle_timeout_s > 0:
            self._timer = asyncio.get_running_loop().call_later(
                self._idle_timeout_s, self._check_idle
            )

    def on_usage_event(self, event: bytes) -> bool:
        """Called by the C relay for an event with a usage object: keeps the usage and says
        whether the event is the usage chunk, by `read_usage_event`, as the Python relay does."""
        try:
            usage, usage_chunk = read_usage_event(event)
        except Exception:  # noqa: BLE001 (never raise into the C relay: drop the event instead)
            return True
        if usage is not None:
            self.usage = usage
        return usage_chunk

    def apply(self, records: list[tuple[float, int]], now: float) -> None:
        """Token events the C relay read (at their read times), charged together at `now`."""
        if not records:
            return
        flight, observe_gap = self.flight, self._owner.observe_gap
        tokens = 0
        for at, count in records:
            record_tokens(flight, observe_gap, at, count)
            tokens += count
        self._owner.charge(flight.request, tokens, now)

    def end(self, error: Exception | None) -> None:
        """The C relay let go of the stream: take back the sockets' state and resolve `done`."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        handle = self.handle
        assert _fastrelay is not None
        unsent = handle.take_unsent()
        outcome = handle.outcome
        self._writer.output_size += handle.bytes_written
        if outcome == _fastrelay.CLIENT_GONE or self._client.is_closing():
            self.client_gone = True
        elif unsent:
            self._client.write(unsent)  # already framed; the transport buffers a slow client
            self._writer.output_size += len(unsent)
        if error is None:
            if outcome in (_fastrelay.ENGINE_CLOSED, _fastrelay.BAD_FRAMING):
                error = EngineClosedError(handle.error or "the engine connection failed")
            elif outcome == _fastrelay.ENDED and not handle.seen_event:
                error = NotAnEventStreamError()
        self.error = error
        if not self.done.done():
            self.done.set_result(None)

    def write_error(self, message: bytes) -> None:
        """A failure after the first byte: a final error event (the status line is gone)."""
        if not self._client.is_closing():
            data = frame(b"data: " + message + b"\n\n", self._chunked)
            self._client.write(data)
            self._writer.output_size += len(data)

    def _check_idle(self) -> None:
        """The engine's idle timeout, as `EngineConnection` keeps it: time since its last byte,
        not counted while a slow client holds the engine back."""
        self._timer = None
        handle = self.handle
        assert _fastrelay is not None
        if handle.outcome != _fastrelay.RUNNING:
            # Ended but never reported (the relay ran out of memory): end it here.
            self._owner.cancel(self)
            return
        now = time.monotonic()
        due = (
            now + self._idle_timeout_s
            if handle.engine_paused
            else handle.last_rx + self._idle_timeout_s
        )
        if now >= due:
            timeout = EngineTimeoutError("the inference engine did not answer in time")
            self._owner.cancel(self, timeout)
        else:
            self._timer = asyncio.get_running_loop().call_later(due - now, self._check_idle)


class NativeRelay:
    """The C relay's epoll set, watched by the running event loop; one per sidecar."""

    def __init__(
        self,
        charge: Callable[[Request, int, float], None],
        observe_gap: Callable[[float], None],
        clock: Callable[[], float],
        nice: int = RELAY_NICE,
    ) -> None:
        if _fastrelay is None:
            raise NativeRelayUnavailableError(NATIVE_MISSING)
        self.charge = charge
        self.observe_gap = observe_gap
        self._clock = clock
        self._loop = asyncio.get_running_loop()
        self._c: CRelay = _fastrelay.Relay(nice)
        self._streams: dict[CStream, NativeStream] = {}
        self._flush_handle: asyncio.TimerHandle | None = None
        self._loop.add_reader(self._c.fileno(), self._on_ready)

    @property
    def active(self) -> int:
        """Streams being relayed (for tests and the admin state)."""
        return len(self._streams)

    def unsent_bytes(self) -> list[int]:
        """Per stream, the bytes held for a client whose socket is full (bounded by the C
        relay's high-water mark plus one engine read)."""
        return [handle.unsent for handle in self._streams]

    def start(
        self,
        engine_fd: int,
        client_fd: int,
        held_body: bytes | None,
        flight: Flight,
        client: asyncio.WriteTransport,
        writer: BodyCounter,
        chunked: bool,
        idle_timeout_s: float,
    ) -> NativeStream:
        """Relay the rest of a chunked event-stream body (`held_body`: its bytes read so far).

        Raises OSError where the sockets cannot be duplicated or watched (out of descriptors):
        the caller relays in Python instead."""
        stream = NativeStream(self, flight, client, writer, chunked, idle_timeout_s)
        handle = self._c.start(
            engine_fd,
            client_fd,
            held_body or b"",
            chunked,
            flight.call.client_wants_usage,
            stream.on_usage_event,
        )
        stream.begin(handle)
        self._streams[handle] = stream
        self._schedule_flush()
        assert _fastrelay is not None
        if handle.outcome != _fastrelay.RUNNING:  # the whole body came with the head
            self._end(handle, None)
        return stream

    def cancel(self, stream: NativeStream, error: Exception | None = None) -> None:
        """Stop relaying `stream` now (a timeout, or its request was cancelled); no-op once it
        ended. Its tokens so far are charged and its unsent bytes handed back."""
        stream.handle.cancel()
        self._end(stream.handle, error)

    def close(self) -> None:
        for stream in list(self._streams.values()):
            self.cancel(stream, ConnectionResetError("the sidecar is shutting down"))
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._loop.remove_reader(self._c.fileno())
        self._c.close()

    def _on_ready(self) -> None:
        try:
            finished = self._c.poll()
        finally:
            self._schedule_flush()
        if finished is not None:
            for handle in finished:
                self._end(handle, None)

    def _schedule_flush(self) -> None:
        if self._flush_handle is None and self._c.has_dirty:
            self._flush_handle = self._loop.call_later(FLUSH_S, self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        dirty = self._c.take_dirty()
        if dirty is None:
            return
        now = self._clock()
        for handle in dirty:
            stream = self._streams.get(handle)
            if stream is not None:
                try:
                    stream.apply(handle.take(), now)
                except Exception as exc:  # noqa: BLE001 (one stream's failure is its own)
                    self._report(exc, "charging a stream's tokens")

    def _end(self, handle: CStream, error: Exception | None) -> None:
        stream = self._streams.pop(handle, None)
        if stream is None:
            return  # ended already (reported by poll after a cancel or a start that ended it)
        try:
            stream.apply(handle.take(), self._clock())
        except Exception as exc:  # noqa: BLE001 (its request still ends, and the others too)
            self._report(exc, "charging a stream's last tokens")
        finally:
            stream.end(error)

    def _report(self, exc: Exception, doing: str) -> None:
        self._loop.call_exception_handler(
            {"message": f"fleetwarden C relay: {doing} failed", "exception": exc}
        )


def why_not_native(engine_url: str, clock: Callable[[], float] = time.monotonic) -> str | None:
    """Why this sidecar cannot use the C relay, or None if it can."""
    if NATIVE_MISSING is not None:
        return NATIVE_MISSING
    if engine_url.startswith("https:"):
        return "the engine is reached over TLS (the C relay reads plain sockets)"
    if clock is not time.monotonic:
        return "the scheduler's clock is not time.monotonic (the C relay's read times are)"
    return None


def native_relay_for(
    mode: str,
    engine_url: str,
    charge: Callable[[Request, int, float], None],
    observe_gap: Callable[[float], None],
    clock: Callable[[], float],
    nice: int = RELAY_NICE,
) -> NativeRelay | None:
    """The C relay for `--relay mode`, or None for the Python relay (call in the running loop)."""
    if mode not in RELAY_MODES:
        raise ValueError(f"relay mode must be one of {', '.join(RELAY_MODES)}, not {mode!r}")
    if mode == "python":
        return None
    reason = why_not_native(engine_url, clock)
    if reason is not None:
        if mode == "native":
            raise NativeRelayUnavailableError(f"--relay native: {reason}")
        return None
    return NativeRelay(charge, observe_gap, clock, nice)


__all__ = [
    "FLUSH_S",
    "NATIVE_MISSING",
    "RELAY_MODES",
    "RELAY_NICE",
    "NativeRelay",
    "NativeRelayUnavailableError",
    "NativeStream",
    "native_relay_for",
    "why_not_native",
]
