"""The C relay (`_fastrelay`, `native_relay`) when something fails: the failure stays contained.

Why: the C relay holds every stream of a sidecar in one epoll set served by its own thread, so a
failure in one place can hang, corrupt or leak the others: Python code run by `poll()` that calls
back into the relay or raises, an engine that hangs up while it is held back, one stream's charge
raising, the relay refusing a stream. Sockets are real kernel sockets (socket pairs, a 127.0.0.1
TCP pair where a reset needs TCP, the real sidecar and engine for the fallback), as in
`test_native_relay_rules.py`, whose helpers these tests share.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import socket
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from fleetwarden.api.enums import Tier
from fleetwarden.fairness.request import Request
from fleetwarden.sidecar.flight import Flight
from fleetwarden.sidecar.native_relay import NATIVE_MISSING, NativeRelay
from fleetwarden.sidecar.openai_request import CallKind, parse_call
from tests.sidecar.test_native_relay_rules import (
    DONE,
    WAIT_S,
    UsageKeeper,
    caught_up,
    chunk_encode,
    content,
    drain,
    fr,
    read_at_least,
    reported,
    sockets,
    unchunk,
    usage_only,
)
from tests.sidecar.test_relay_soak import call, expect_complete, running_engine, running_sidecar
from tests.support.eventually import eventually

pytestmark = pytest.mark.skipif(
    NATIVE_MISSING is not None, reason=f"the C relay is not built: {NATIVE_MISSING}"
)

USAGE = usage_only(4, spaced_usage=False, spaced_choices=False)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@contextlib.contextmanager
def relay_with(streams: list[Any]) -> Iterator[Any]:
    """A bare C relay; the streams a test appends to `streams` are cancelled before it closes."""
    relay = fr.Relay()
    try:
        yield relay
    finally:
        for stream in streams:
            stream.cancel()
        relay.close()


class Reentrant:
    """An `on_usage` that calls back into the relay (`relay.<how>`), keeps what that raised,
    then answers as `UsageKeeper` does: the stream it is asked about must go on."""

    def __init__(self, relay: Any, how: str, spare: Any, streams: list[Any]) -> None:
        self.relay, self.how, self.spare, self.streams = relay, how, spare, streams
        self.raised: list[Exception] = []

    def __call__(self, event: bytes) -> bool:
        try:
            if self.how == "start":
                engine, _, client, _ = self.spare
                self.streams.append(
                    self.relay.start(
                        engine.fileno(), client.fileno(), b"", True, False, UsageKeeper()
                    )
                )
            else:
                getattr(self.relay, self.how)()
        except RuntimeError as exc:
            self.raised.append(exc)
        return UsageKeeper()(event)


def relays_a_new_stream(relay: Any, streams: list[Any]) -> None:
    """The relay still takes a stream and relays its body to the end."""
    body = content("after") + DONE
    with sockets() as (engine, engine_peer, client, client_peer):
        stream = relay.start(engine.fileno(), client.fileno(), b"", False, False, UsageKeeper())
        streams.append(stream)
        engine_peer.sendall(chunk_encode(body, 4096))
        assert stream in reported(relay, stream)
        assert (stream.outcome, stream.clean_end, stream.tokens) == (fr.ENDED, True, 1)
        assert drain(client_peer) == body
    assert relay.active == 0


def refused_then_relayed(relay: Any, on_usage: Reentrant, stream: Any, peers: Any) -> None:
    """`stream` is parked on its usage event (`USAGE`, after `content("a")`): the next poll
    asks `on_usage`, whose call into the relay is refused and leaves the relay as it was (no
    stream started); the stream then relays the rest of its body to the end."""
    engine_peer, client_peer = peers
    head = chunk_encode(content("a"), 4096)[: -len(b"0\r\n\r\n")]
    got = read_at_least(client_peer, len(head), bytearray())
    assert (bytes(got), on_usage.raised) == (head, [])  # what came before; not asked yet
    fds, active = open_fds(), relay.active
    caught_up(relay, lambda _: len(on_usage.raised) == 1, "on_usage to be called by a poll")
    assert [str(exc) for exc in on_usage.raised] == ["the relay is polling (called from on_usage?)"]
    assert (relay.active, open_fds()) == (active, fds)  # nothing started or closed
    engine_peer.sendall(chunk_encode(content("b") + DONE, 4096))
    reported(relay, stream)
    assert (stream.outcome, stream.clean_end, stream.error) == (fr.ENDED, True, None)
    assert stream.tokens == 2  # the usage chunk is not a token ...
    body = b"".join(unchunk(bytes(got + drain(client_peer))))
    assert body == content("a") + content("b") + DONE  # ... nor forwarded


@pytest.mark.parametrize("how", ["poll", "start", "close"])
def test_reentry_from_on_usage_for_a_usage_event_in_the_initial_bytes(how: str) -> None:
    """A usage event in the bytes that came with the head parks the stream in `start` (which no
    longer calls `on_usage`); the next poll answers it through `on_usage`, whose call to
    `relay.<how>` is refused, and the stream goes on."""
    streams: list[Any] = []
    with relay_with(streams) as relay, sockets() as socks, sockets() as spare:
        engine, engine_peer, client, client_peer = socks
        on_usage = Reentrant(relay, how, spare, streams)
        initial = chunk_encode(content("a") + USAGE, 4096)[: -len(b"0\r\n\r\n")]
        stream = relay.start(engine.fileno(), client.fileno(), initial, True, False, on_usage)
        streams.append(stream)
        assert (stream.outcome, relay.active) == (fr.RUNNING, 1)
        refused_then_relayed(relay, on_usage, stream, (engine_peer, client_peer))
        relays_a_new_stream(relay, streams)


@pytest.mark.parametrize("how", ["poll", "start", "close"])
def test_reentry_from_on_usage_for_a_usage_event_read_later(how: str) -> None:
    """The usage event comes over the engine's socket: the relay thread parks the stream, the
    next poll calls `on_usage`, whose call to `relay.<how>` is refused; the stream goes on."""
    streams: list[Any] = []
    with relay_with(streams) as relay, sockets() as socks, sockets() as spare:
        engine, engine_peer, client, client_peer = socks
        on_usage = Reentrant(relay, how, spare, streams)
        stream = relay.start(engine.fileno(), client.fileno(), b"", True, False, on_usage)
        streams.append(stream)
        engine_peer.sendall(chunk_encode(content("a") + USAGE, 4096)[: -len(b"0\r\n\r\n")])
        refused_then_relayed(relay, on_usage, stream, (engine_peer, client_peer))
        relays_a_new_stream(relay, streams)


def test_an_on_usage_that_raises_ends_only_its_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """An error out of `on_usage` cannot be raised by `poll()` (other streams' answers and
    reports are due): it is reported as unraisable and its stream ends as an engine failure,
    reported by a poll, its socket duplicates closed; the relay goes on with the others."""
    failure = ValueError("a parser bug")
    unraisable: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda hook: unraisable.append(hook.exc_value))

    def on_usage(event: bytes) -> bool:
        raise failure

    streams: list[Any] = []
    with relay_with(streams) as relay, sockets() as socks:
        engine, engine_peer, client, client_peer = socks
        before = open_fds()
        stream = relay.start(engine.fileno(), client.fileno(), b"", False, False, on_usage)
        streams.append(stream)
        engine_peer.sendall(chunk_encode(content("a") + USAGE + content("b") + DONE, 4096))
        assert reported(relay, stream) == [stream]
        assert unraisable == [failure]
        assert (stream.outcome, stream.error) == (
            fr.ENGINE_CLOSED,
            "the relay could not read a usage event",
        )
        assert (relay.active, open_fds()) == (0, before)
        assert drain(client_peer) == content("a")  # nothing from the usage event on
        relays_a_new_stream(relay, streams)


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """(engine side, engine peer) over 127.0.0.1, with small buffers: the engine's kernel
    queue fills within a few hundred KiB."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)  # the accepted peer's
        server.bind(("127.0.0.1", 0))
        server.listen()
        engine = socket.socket()
        engine.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        engine.connect(server.getsockname())
        peer, _ = server.accept()
    return engine, peer


@pytest.mark.parametrize("hang_up", ["close", "tcp-reset"])
def test_a_paused_engine_that_hangs_up_is_not_read_past_the_pause(hang_up: str) -> None:
    """A hang-up is reported by epoll whatever the mask: a paused engine must not be read on
    (by the relay thread, at once and again: the hang-up is level-triggered) until the client
    drains, else the bound on bytes held for a slow client does not hold. The relay is given
    0.2 s to do it wrong (nothing is signalled, read or reported meanwhile)."""
    body = content("x" * 200) * 10_000  # ~2.4 MB: more than the kernel buffers on the way
    wire = chunk_encode(body, 16 * 1024)[: -len(b"0\r\n\r\n")]  # the body does not end
    engine, engine_peer = tcp_pair() if hang_up == "tcp-reset" else socket.socketpair()
    client, client_peer = socket.socketpair()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    client_peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    for sock in (engine, engine_peer, client, client_peer):
        sock.setblocking(False)
    streams: list[Any] = []
    with relay_with(streams) as relay, engine, engine_peer, client, client_peer:
        stream = relay.start(engine.fileno(), client.fileno(), b"", True, False, UsageKeeper())
        streams.append(stream)
        sent, deadline = 0, time.monotonic() + WAIT_S
        while time.monotonic() < deadline:  # the client reads nothing: fill until held back
            try:
                sent += engine_peer.send(wire[sent : sent + 65536])
            except BlockingIOError:
                if stream.engine_paused:
                    break
                select.select([], [engine_peer], [], 0.001)  # the relay thread reads on
            relay.poll()
        assert stream.engine_paused
        assert sent < len(wire)
        unsent = stream.unsent
        if hang_up == "tcp-reset":
            engine_peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        engine_peer.close()
        # a while for the relay thread to (wrongly) see the hang-up: nothing may be signalled
        signalled = select.select([relay.fileno()], [], [], 0.2)[0]
        assert stream.unsent == unsent  # nothing read past the pause
        assert stream.outcome == fr.RUNNING  # the hang-up is seen once the client drains
        assert (signalled, relay.poll()) == ([], None)
        received = bytearray()
        deadline = time.monotonic() + 60
        while stream.outcome == fr.RUNNING and time.monotonic() < deadline:
            received += drain(client_peer)
            relay.poll()
            select.select([client_peer], [], [], 0.001)
        assert stream.outcome == fr.ENGINE_CLOSED  # the body had not ended
        received += drain(client_peer) + stream.take_unsent()
    forwarded = b"".join(unchunk(bytes(received)))
    assert len(forwarded) > 0
    assert body.startswith(forwarded)


@dataclass
class Writer:
    """The response writer as the relay sees it (`BodyCounter`): its byte count."""

    output_size: int = 0


def flight(seq: int) -> Flight:
    """A real Flight: the call parsed as the sidecar parses it, its Request as it builds it."""
    raw = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    parsed = parse_call(raw, CallKind.CHAT, default_max_tokens=16, forward_priority=False)
    now = time.monotonic()
    request = Request(seq, "tenant", now, parsed.prompt_tokens, parsed.max_tokens)
    return Flight(request, parsed, Tier.IW_NORMAL.value, now, now, None)


async def test_one_streams_failing_charge_does_not_hang_the_others() -> None:
    """The client is a real asyncio transport (`connect_accepted_socket` on one side of a socket
    pair), as aiohttp's is: `NativeStream.end` asks it `is_closing()` and writes unsent bytes
    through it, and the C relay works on a duplicate of its socket, as in `Relay._hand_off`."""
    loop = asyncio.get_running_loop()
    charged: list[tuple[Request, int]] = []
    failure = RuntimeError("a policy bug in one request's charge")

    def charge(request: Request, tokens: int, now: float) -> None:
        charged.append((request, tokens))
        if len(charged) == 1:
            raise failure

    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    native = NativeRelay(charge, lambda gap: None, time.monotonic)
    with contextlib.ExitStack() as stack:
        streams, peers = [], []
        for seq in range(2):
            engine, engine_peer, client, client_peer = stack.enter_context(sockets())
            transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, sock=client)
            stack.callback(transport.close)
            stream = native.start(
                engine.fileno(),
                transport.get_extra_info("socket").fileno(),
                None,
                flight(seq),
                transport,  # type: ignore[arg-type]
                Writer(),
                True,
                1.0,
            )
            streams.append(stream)
            peers.append((engine_peer, client_peer))
        for engine_peer, _ in peers:  # both bodies end in the same poll
            engine_peer.sendall(chunk_encode(content("a") + DONE, 4096))
        try:
            await asyncio.wait_for(asyncio.gather(*(s.done for s in streams)), WAIT_S)
            assert native.active == 0
            assert [s.error for s in streams] == [None, None]
            assert sorted(r.seq for r, _ in charged) == [0, 1]  # the other one was charged
            assert [c.get("exception") for c in reported] == [failure]
            for _, client_peer in peers:
                assert b"".join(unchunk(drain(client_peer))) == content("a") + DONE
        finally:
            native.close()
            loop.set_exception_handler(previous)


async def test_the_c_relay_refusing_a_stream_hands_it_to_the_python_relay(
    relay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`NativeRelay.start` raising OSError(EMFILE) stands in for the process running out of file
    descriptors (each C stream duplicates two sockets), which cannot be done safely inside the
    test process: the stream is relayed in Python, whole, and the next one in C again."""
    if relay != "native":
        pytest.skip("this sidecar relays in Python: it has no C relay to refuse a stream")
    attempts: list[int] = []

    def out_of_descriptors(*args: object) -> Any:
        attempts.append(len(args))
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    async with running_engine(step_s=0.01) as engine, running_sidecar(engine.url) as sidecar:
        native = sidecar.state.relay.native
        assert native is not None
        with monkeypatch.context() as patch:
            patch.setattr(NativeRelay, "start", out_of_descriptors)
            result = await asyncio.wait_for(call(sidecar.url, "ok", 1, 20, usage=True), 20)
        assert len(attempts) == 1
        expect_complete(result, 20, usage=True)
        following = asyncio.create_task(call(sidecar.url, "ok", 2, 40, usage=True))
        await eventually(lambda: native.active == 1, 10, 0.001)  # the C relay has it
        expect_complete(await asyncio.wait_for(following, 20), 40, usage=True)
        await eventually(sidecar.settled, 10)
        assert sidecar.outcomes() == {"served": 2}
