"""The C relay (`_fastrelay`) follows the Python relay's rules (`split_events`, `plain_tokens`).

Why: the sidecar picks either relay per stream, so a client must get the same bytes, the
scheduler the same token charges and the settlement the same usage from both. These tests drive
`_fastrelay.Relay` directly. Each `socket.socketpair()` is a pair of real kernel sockets standing
in for the engine's and the client's TCP connections (nothing mocked): the C relay reads and
writes duplicates of the non-blocking sides it is handed, the tests write the engine's chunked
body into one peer and read what the client got from the other.

The relay relays on a thread of its own: a test that writes engine bytes waits for it to catch up
(`caught_up`: as the event loop does, it polls when `fileno()` is readable, with a deadline)
instead of expecting `poll()` to have relayed them.
"""

from __future__ import annotations

import array
import bisect
import contextlib
import fcntl
import os
import re
import select
import socket
import string
import sys
import termios
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.sidecar.native_relay import NATIVE_MISSING
from fleetwarden.sidecar.stream import plain_tokens, read_usage_event, split_events

fr: Any
try:
    from fleetwarden.sidecar import _fastrelay as fr
except ImportError:  # the module is skipped below, with the reason
    fr = None

pytestmark = pytest.mark.skipif(
    NATIVE_MISSING is not None, reason=f"the C relay is not built: {NATIVE_MISSING}"
)

Socks = tuple[socket.socket, socket.socket, socket.socket, socket.socket]

ROLE = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
PING = b": ping\n\n"
DONE = b"data: [DONE]\n\n"
TEXT = st.text(alphabet=string.ascii_letters + string.digits + " ", max_size=12)


def content(text: str) -> bytes:
    return b'data: {"choices":[{"delta":{"content":"%s"}}]}\n\n' % text.encode()


def usage_only(completion: int, spaced_usage: bool, spaced_choices: bool) -> bytes:
    choices = b'"choices": [ ]' if spaced_choices else b'"choices":[]'
    usage = b'"usage": {' if spaced_usage else b'"usage":{'
    fields = b'"prompt_tokens":3,"completion_tokens":%d}' % completion
    return b"data: {" + choices + b"," + usage + fields + b"}\n\n"


def usage_with_choice(text: str, completion: int) -> bytes:
    """A continuous-usage-stats chunk: a token that also carries the usage so far."""
    return content(text)[: -len(b"}\n\n")] + b',"usage":{"completion_tokens":%d}}\n\n' % completion


EVENTS = st.one_of(
    TEXT.map(content),
    st.just(ROLE),
    st.builds(usage_only, st.integers(0, 999), st.booleans(), st.booleans()),
    st.builds(usage_with_choice, TEXT, st.integers(0, 999)),
    st.just(PING),
    st.just(DONE),
)


@st.composite
def engine_bodies(draw: st.DrawFn) -> tuple[bytes, list[bytes], list[bytes]]:
    """(body, wire reads, the body bytes each read carries): the body chunk-encoded at random
    sizes, then the wire cut at random points (the first read is `initial`)."""
    body = b"".join(draw(st.lists(EVENTS, max_size=12)))
    wire = bytearray()
    at_wire: list[int] = []  # wire offset of each body byte
    pos = 0
    while pos < len(body):
        data = body[pos : pos + draw(st.integers(1, 40))]
        wire += (b"%X" if draw(st.booleans()) else b"%x") % len(data)
        wire += b";ext=1\r\n" if draw(st.booleans()) else b"\r\n"
        at_wire.extend(range(len(wire), len(wire) + len(data)))
        wire += data + b"\r\n"
        pos += len(data)
    wire += b"0\r\n" + (b"x-t: 1\r\n" if draw(st.booleans()) else b"") + b"\r\n"
    cuts = sorted(draw(st.lists(st.integers(0, len(wire)), max_size=10)))
    bounds = list(zip([0, *cuts], [*cuts, len(wire)], strict=True))
    reads = [bytes(wire[a:b]) for a, b in bounds]
    decoded = [
        body[bisect.bisect_left(at_wire, a) : bisect.bisect_left(at_wire, b)] for a, b in bounds
    ]
    return body, reads, decoded


def is_usage(event: bytes) -> bool:
    """Whether the rules hand `event` to `on_usage` (`split_events`: `[DONE]` first)."""
    return not event.startswith(DONE[:12]) and (b'"usage":{' in event or b'"usage": {' in event)


def usage_cuts(events: bytes) -> list[bytes]:
    """Complete `events` cut before each usage event: the C relay parks a stream there until
    poll() answers, so it writes what came before a usage event and what follows it apart."""
    parts, start, pos = [], 0, 0
    while (end := events.find(b"\n\n", pos)) >= 0:
        if is_usage(events[pos : end + 2]):
            parts.append(events[start:pos])
            start = pos
        pos = end + 2
    return [*parts, events[start:pos]]


def python_relay(decoded: list[bytes], wants_usage: bool) -> tuple[list[bytes], list[int]]:
    """Per relay step, what `StreamRelay.on_body` forwards and counts (fast path, else per
    event). A step is one engine read, cut before each usage event (`usage_cuts`)."""
    pending, forwarded, tokens = b"", [], []
    for read in decoded:
        data, pending = pending + read, b""
        count = plain_tokens(data)
        if count >= 0:
            forwarded.append(data)
            tokens.append(count)
            continue
        _, pending, _, _ = split_events(data, wants_usage)
        for part in usage_cuts(data[: len(data) - len(pending)]):
            out, _, _, count = split_events(part, wants_usage)
            forwarded.append(out)
            tokens.append(count)
    return forwarded, tokens


def unchunk(raw: bytes) -> list[bytes]:
    """The client's body parsed strictly: `hex CRLF data CRLF` chunks, none empty (an empty
    chunk would end the response; `write_eof` sends the terminal one)."""
    chunks, pos = [], 0
    while pos < len(raw):
        eol = raw.find(b"\r\n", pos)
        assert eol > pos, raw[pos : pos + 20]
        assert re.fullmatch(rb"[0-9a-f]+", raw[pos:eol]), raw[pos : pos + 20]
        size, start = int(raw[pos:eol], 16), eol + 2
        assert size > 0, raw[pos : pos + 20]
        assert raw[start + size : start + size + 2] == b"\r\n", raw[pos : pos + 20]
        chunks.append(raw[start : start + size])
        pos = start + size + 2
    return chunks


def chunk_encode(body: bytes, size: int) -> bytes:
    parts = [
        b"%x\r\n%b\r\n" % (len(c), c)
        for c in (body[i : i + size] for i in range(0, len(body), size))
    ]
    return b"".join(parts) + b"0\r\n\r\n"


WAIT_S = 10.0
"""How long a test waits for the relay thread (microseconds of work, on a busy machine)."""


def caught_up(
    relay: Any,
    until: Callable[[list[Any]], bool],
    what: str,
    finished: list[Any] | None = None,
    timeout_s: float = WAIT_S,
) -> list[Any]:
    """Polls `relay` as the event loop does (on `fileno()`, or every 10 ms at most: bytes
    reaching a client are not signalled) until `until(finished)` holds, `finished` being the
    streams poll() reported (appended to the list given; returned); fails saying `what`."""
    finished = [] if finished is None else finished
    deadline, pause = time.monotonic() + timeout_s, 0.0001
    while True:
        finished += relay.poll() or []
        if until(finished):
            return finished
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"the relay thread did not catch up in {timeout_s:g} s: {what}")
        select.select([relay.fileno()], [], [], min(pause, left))
        pause = min(2 * pause, 0.01)


def reported(relay: Any, *streams: Any, finished: list[Any] | None = None) -> list[Any]:
    """`caught_up` until every stream of `streams` was reported ended."""
    return caught_up(relay, lambda done: all(s in done for s in streams), "ends", finished)


def read_at_least(peer: socket.socket, n: int, got: bytearray) -> bytearray:
    """`got` with what `peer` received appended, once it holds `n` bytes or more (the relay is
    not polled meanwhile: a parked stream stays parked); fails the test after `WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while len(got) < n:
        if not select.select([peer], [], [], max(0.0, deadline - time.monotonic()))[0]:
            pytest.fail(f"the client got {len(got)} bytes in {WAIT_S:g} s, not {n}")
        got += drain(peer)
    return got


def queued(sock: socket.socket) -> int:
    """Bytes waiting in `sock`'s receive queue: 0 once the relay thread read an engine write."""
    count = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, count)
    return count[0]


def read_returned(engine: socket.socket, stream: Any, rx_before: float) -> bool:
    """Whether the relay thread's recv() of the last engine write has returned: its queue is
    empty and the stream took a new read time (`last_rx`, set once recv() returned). The queue
    alone is not enough: a recv() that has just emptied it looks for more before it returns, so
    a write made in that instant joins the same read (1 run in 15 merged two steps' chunks)."""
    return queued(engine) == 0 and stream.last_rx != rx_before


def drain(sock: socket.socket) -> bytes:
    """Everything readable now on a non-blocking socket."""
    got = bytearray()
    while True:
        try:
            data = sock.recv(1 << 16)
        except BlockingIOError:
            return bytes(got)
        if not data:
            return bytes(got)
        got += data


@contextlib.contextmanager
def sockets() -> Iterator[Socks]:
    """(engine side, engine peer, client side, client peer); the sides go to the C relay."""
    engine_side, engine_peer = socket.socketpair()
    client_side, client_peer = socket.socketpair()
    for sock in (engine_side, client_side, client_peer):
        sock.setblocking(False)
    try:
        yield engine_side, engine_peer, client_side, client_peer
    finally:
        for sock in (engine_side, engine_peer, client_side, client_peer):
            sock.close()


class UsageKeeper:
    """The stream's `on_usage`, as `NativeStream.on_usage_event` (the Python rule)."""

    def __init__(self) -> None:
        self.usage: dict[str, Any] | None = None

    def __call__(self, event: bytes) -> bool:
        usage, usage_chunk = read_usage_event(event)
        if usage is not None:
            self.usage = usage
        return usage_chunk


@contextlib.contextmanager
def relay_of() -> Iterator[Any]:
    """A relay whose streams still running at the end are cancelled, then closed."""
    relay = fr.Relay()
    streams: list[Any] = []
    keepers: dict[int, UsageKeeper] = {}
    original = relay.start

    def start(*args: Any) -> Any:
        keeper = UsageKeeper()
        stream = original(*args, keeper)
        streams.append(stream)
        keepers[id(stream)] = keeper
        return stream

    start.usage_of = lambda stream: keepers[id(stream)].usage  # type: ignore[attr-defined]
    try:
        yield relay, start
    finally:
        for stream in streams:
            stream.cancel()
        relay.close()


@settings(deadline=None, max_examples=150)
@given(case=engine_bodies(), wants_usage=st.booleans(), chunked_out=st.booleans())
def test_relays_what_the_python_relay_relays(
    case: tuple[bytes, list[bytes], list[bytes]], wants_usage: bool, chunked_out: bool
) -> None:
    """Per relay step: each write of the engine is read by the relay thread before the next
    one is made (its recv() returned: `read_returned`), so no two are read as one, and the C
    relay's chunks and token records are compared with the Python relay's per read, cut where
    a usage event parks the stream (`python_relay`); the totals are compared as well."""
    body, reads, decoded = case
    whole, _, whole_usage, whole_tokens = split_events(body, wants_usage)
    per_read, per_read_tokens = python_relay(decoded, wants_usage)
    with relay_of() as (relay, start), sockets() as (engine, engine_peer, client, client_peer):
        before = time.monotonic()
        stream = start(engine.fileno(), client.fileno(), reads[0], chunked_out, wants_usage)
        finished: list[Any] = []
        for read in reads[1:]:
            if read:
                rx = stream.last_rx
                engine_peer.sendall(read)
                # polls meanwhile: a usage event read before parks the stream until answered
                caught_up(
                    relay, lambda _, rx=rx: read_returned(engine, stream, rx), "the read", finished
                )
        reported(relay, stream, finished=finished)
        after = time.monotonic()
        assert (stream.outcome, stream.error) == (fr.ENDED, None)
        assert stream.clean_end
        assert finished == [stream]
        records = stream.take()
        unsent = stream.take_unsent()
        received = drain(client_peer)
    assert unsent == b""
    assert stream.bytes_written == len(received)
    if chunked_out:
        assert unchunk(received) == [data for data in per_read if data]  # one chunk per step
        forwarded = b"".join(unchunk(received))
    else:
        forwarded = received
    assert forwarded == whole == b"".join(per_read)
    assert [n for _, n in records] == [n for n in per_read_tokens if n]
    assert sum(n for _, n in records) == whole_tokens == stream.tokens
    times = [t for t, _ in records]
    assert times == sorted(times)
    assert all(before <= t <= after for t in times)
    assert start.usage_of(stream) == whole_usage
    assert stream.seen_event == (whole.startswith(b"data:") or b"\ndata:" in whole)


def test_a_bad_chunk_size_is_bad_framing() -> None:
    with relay_of() as (relay, start), sockets() as (engine, engine_peer, client, _):
        stream = start(engine.fileno(), client.fileno(), b"", True, False)
        engine_peer.sendall(b"zz\r\n" + content("a"))
        assert reported(relay, stream) == [stream]
        assert (stream.outcome, stream.error) == (fr.BAD_FRAMING, "bad chunk size")


def test_no_crlf_after_chunk_data_is_bad_framing() -> None:
    with relay_of() as (relay, start), sockets() as (engine, engine_peer, client, _):
        stream = start(engine.fileno(), client.fileno(), b"", True, False)
        engine_peer.sendall(b"5\r\nhelloXX5\r\n")
        assert reported(relay, stream) == [stream]
        assert stream.outcome == fr.BAD_FRAMING
        assert stream.error == "bad chunk framing: no CRLF after a chunk"


def test_the_engine_closing_mid_body_is_engine_closed() -> None:
    with relay_of() as (relay, start), sockets() as (engine, engine_peer, client, client_peer):
        event = content("hi")
        stream = start(
            engine.fileno(), client.fileno(), b"%x\r\n%b\r\n" % (len(event), event), False, False
        )
        assert stream.outcome == fr.RUNNING
        engine_peer.sendall(b"40\r\ndata: {")
        engine_peer.close()
        assert reported(relay, stream) == [stream]
        assert stream.outcome == fr.ENGINE_CLOSED
        assert stream.error == "the engine closed the connection mid-response"
        assert drain(client_peer) == event


def test_bytes_after_the_terminal_chunk_end_it_unclean() -> None:
    with relay_of() as (relay, start), sockets() as (engine, engine_peer, client, _):
        stream = start(engine.fileno(), client.fileno(), b"", True, False)
        engine_peer.sendall(chunk_encode(content("a"), 64) + b"HTTP/1.1 200 OK\r\n")
        assert reported(relay, stream) == [stream]
        assert (stream.outcome, stream.clean_end) == (fr.ENDED, False)


@pytest.mark.parametrize("leave", ["close", "shutdown"])
def test_a_client_that_left_is_client_gone(leave: str) -> None:
    with relay_of() as (relay, start), sockets() as (engine, engine_peer, client, client_peer):
        stream = start(engine.fileno(), client.fileno(), b"", True, False)
        if leave == "close":
            client_peer.close()
        else:
            client_peer.shutdown(socket.SHUT_RDWR)
        engine_peer.sendall(b"%x\r\n%b\r\n" % (len(content("a")), content("a")))
        assert reported(relay, stream) == [stream]
        assert (stream.outcome, relay.active) == (fr.CLIENT_GONE, 0)


def test_a_body_all_in_initial_ends_during_start() -> None:
    """`start` relays a whole body at once and the next poll reports the stream; a later poll,
    after the relay thread's batch that lets go of it (or 0.1 s), does not report it again."""
    body = ROLE + content("a") + content("b") + DONE
    with relay_of() as (relay, start), sockets() as (engine, _, client, client_peer):
        stream = start(engine.fileno(), client.fileno(), chunk_encode(body, 50), False, False)
        assert (stream.outcome, stream.clean_end, stream.tokens) == (fr.ENDED, True, 2)
        assert relay.active == 0
        assert relay.poll() == [stream]  # also reported by the next poll (the wrapper ignores it)
        select.select([relay.fileno()], [], [], 0.1)
        assert relay.poll() is None
        assert drain(client_peer) == body


def test_cancel_closes_both_duplicates() -> None:
    """A cancelled stream's duplicates are closed at once; it is not reported by poll(), even
    once the relay thread let go of it (its reference is dropped by a poll)."""
    fds = "/proc/self/fd"
    with relay_of() as (relay, start), sockets() as (engine, engine_peer, client, _):
        before = len(os.listdir(fds))
        stream = start(engine.fileno(), client.fileno(), b"", True, False)
        assert len(os.listdir(fds)) == before + 2
        let_go = sys.getrefcount(stream) - 1  # without the relay's reference
        stream.cancel()
        assert (stream.outcome, relay.active, len(os.listdir(fds))) == (fr.CANCELLED, 0, before)
        released = caught_up(relay, lambda _: sys.getrefcount(stream) == let_go, "a release")
        assert released == []  # a cancelled stream is not reported
        stream.cancel()  # a no-op once ended
        engine.close()
        engine_peer.settimeout(5)
        assert engine_peer.recv(16) == b""  # no duplicate keeps the engine's socket open


def test_closing_a_relay_with_a_running_stream_raises() -> None:
    relay = fr.Relay()
    with sockets() as (engine, _, client, _):
        stream = relay.start(engine.fileno(), client.fileno(), b"", True, False, UsageKeeper())
        with pytest.raises(RuntimeError):
            relay.close()
        stream.cancel()
        relay.close()


def test_a_slow_client_pauses_the_engine_and_loses_nothing() -> None:
    event = content("x" * 200)
    body = event * (2 * 1024 * 1024 // len(event))
    wire = chunk_encode(body, 16 * 1024)
    bound = (256 + 64 + 64) * 1024
    with relay_of() as (relay, start), sockets() as (engine, engine_peer, client, client_peer):
        client_peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        engine_peer.setblocking(False)
        stream = start(engine.fileno(), client.fileno(), b"", True, False)
        sent, paused, most_unsent, received = 0, False, 0, bytearray()

        def step(read_client: bool) -> bool:
            """Send what fits, poll, wait up to 1 ms; False once the engine peer is blocked."""
            nonlocal sent, paused, most_unsent
            blocked = False
            if sent < len(wire):
                try:
                    sent += engine_peer.send(wire[sent : sent + 65536])
                except BlockingIOError:
                    blocked = True
            if read_client:
                received.extend(drain(client_peer))
            relay.poll()
            paused = paused or stream.engine_paused
            most_unsent = max(most_unsent, stream.unsent)
            waits = ([client_peer] if read_client else [], [engine_peer] if blocked else [])
            select.select(*waits, [], 0.001)
            return not blocked

        deadline = time.monotonic() + 60
        # the client does not read: the engine must be held back
        while (step(False) or not paused) and time.monotonic() < deadline:
            pass
        assert paused
        assert sent < len(wire)  # the engine peer was blocked, not done
        while stream.outcome == fr.RUNNING and time.monotonic() < deadline:
            step(True)
        assert (stream.outcome, stream.clean_end) == (fr.ENDED, True)
        assert most_unsent <= bound
        received.extend(drain(client_peer))
        assert stream.bytes_written == len(received)  # what the socket took; unsent is apart
        received.extend(stream.take_unsent())
    assert b"".join(unchunk(bytes(received))) == body
    assert stream.tokens == body.count(b"data:")


@pytest.mark.parametrize(
    "event",
    [  # each a usage event Python treats as the usage-only chunk (its choices parse as falsy)
        b'data: {"choices":[{"delta":{"content":"a"}}],"usage":{"x":%b}}\n\n'
        % (b"[" * 5000 + b"]" * 5000),  # too deep for json.loads: no choices it could parse
        b'data: {"choices":[{"delta":{"content":"a"}}],"usage":{"x":1}\n\n',  # truncated JSON
        b'data: {"choices":{},"usage":{"x":1}}\n\n',  # empty, though not a list
        b'data: {"usage":{"x":1,"choices":[1]},"choices":[]}\n\n',  # a "choices" key nested first
    ],
    ids=["too-deep", "truncated", "empty-object", "nested-key-first"],
)
def test_usage_events_follow_the_python_rule(event: bytes) -> None:
    body, wants_usage = event + DONE, False
    forwarded, _, _, tokens = split_events(body, wants_usage)
    with relay_of() as (relay, start), sockets() as (engine, _, client, client_peer):
        stream = start(
            engine.fileno(), client.fileno(), chunk_encode(body, 4096), False, wants_usage
        )
        reported(relay, stream)  # parked by its usage event until a poll answered it
        assert stream.outcome == fr.ENDED
        assert (drain(client_peer), stream.tokens) == (forwarded, tokens)


def test_bytes_written_counts_only_what_the_client_took() -> None:
    event = content("a")
    with relay_of() as (_, start), sockets() as (engine, _, client, client_peer):
        client_peer.close()  # gone before the first event: the send fails (EPIPE)
        stream = start(engine.fileno(), client.fileno(), chunk_encode(event, 64), True, False)
        assert stream.outcome == fr.CLIENT_GONE
        assert stream.take_unsent() == b""
        assert stream.bytes_written == 0  # "bytes the client's socket took"
