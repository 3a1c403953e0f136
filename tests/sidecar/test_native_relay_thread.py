"""The C relay's own thread (`_fastrelay_thread.c`): what changed when relaying left the loop.

Why: the relay thread relays every stream without the GIL while the event loop runs Python, so
what the loop sees is asynchronous: a usage event parks its stream until `poll()` asked Python
about it, `fileno()` says when poll() has something to do, the relay's references to ended
streams go only once its thread can no longer name them, and the thread itself must start, stop,
yield the CPU (its niceness) and leave signals to Python's main thread. The tests drive
`_fastrelay.Relay` directly over real socket pairs, with the helpers of
`test_native_relay_rules.py`; a test that must show that nothing happens waits 0.1 s.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import select
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fleetwarden.sidecar.native_relay import NATIVE_MISSING
from fleetwarden.sidecar.stream import read_usage_event, split_events
from tests.sidecar.test_native_relay_rules import (
    DONE,
    PING,
    ROLE,
    WAIT_S,
    UsageKeeper,
    caught_up,
    chunk_encode,
    content,
    drain,
    fr,
    queued,
    read_at_least,
    reported,
    sockets,
    unchunk,
    usage_only,
    usage_with_choice,
)

pytestmark = pytest.mark.skipif(
    NATIVE_MISSING is not None, reason=f"the C relay is not built: {NATIVE_MISSING}"
)

NOTHING_MORE_S = 0.1
"""How long a test waits to show that nothing more happens (the relay takes microseconds)."""

END = b"0\r\n\r\n"
USAGE = usage_with_choice("u", 7)  # what on_usage answers is the test's, not the JSON's


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def tasks() -> set[str]:
    """The process's threads (kernel task ids)."""
    return set(os.listdir("/proc/self/task"))


def eventually(check: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Returns once `check()` holds; fails the test saying `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.001)


def let_go(relay: Any, stream: Any, others: int) -> None:
    """Polls until the relay let go of `stream`: `others` references to it are left outside
    this call (its parameter and getrefcount's argument are the two more counted)."""
    caught_up(relay, lambda _: sys.getrefcount(stream) == others + 2, "the relay to let go")


def streams_freed(relay: Any, others: int) -> None:
    """Polls until no stream holds `relay` (each stream does): `others` references to it are
    left outside this call (its parameter, caught_up's and getrefcount's are 3 more)."""
    caught_up(relay, lambda _: sys.getrefcount(relay) == others + 3, "the streams to be freed")


def proc_field(tid: str, name: str) -> str:
    with open(f"/proc/self/task/{tid}/status") as status:
        return next(line.split()[1] for line in status if line.startswith(f"{name}:"))


def nice_of(tid: str) -> int:
    with open(f"/proc/self/task/{tid}/stat") as stat:
        text = stat.read()
    return int(text[text.rindex(")") + 2 :].split()[16])  # field 19: after the comm's ")"


@contextlib.contextmanager
def relay_thread(nice: int = 0) -> Iterator[tuple[Any, str]]:
    """A new relay and its thread's task id; closed at the end."""
    before = tasks()
    relay = fr.Relay(nice=nice)
    try:
        (tid,) = tasks() - before
        yield relay, tid
    finally:
        relay.close()


def relayed_one_stream(relay: Any) -> None:
    """Relays one stream to its end (so the relay thread is surely running its loop)."""
    with sockets() as (engine, engine_peer, client, _):
        stream = relay.start(engine.fileno(), client.fileno(), b"", True, False, UsageKeeper())
        engine_peer.sendall(chunk_encode(content("a") + DONE, 4096))
        reported(relay, stream)


class Answer:
    """An `on_usage` with a fixed answer, keeping the events it was asked about."""

    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.asked: list[bytes] = []

    def __call__(self, event: bytes) -> bool:
        self.asked.append(event)
        return self.answer


@pytest.mark.parametrize(
    ("answer", "wants_usage"),
    [(True, False), (True, True), (False, False)],
    ids=["usage-chunk-dropped", "usage-chunk-wanted", "not-a-usage-chunk"],
)
@pytest.mark.parametrize("ending", ["same-write", "written-while-parked"])
def test_a_usage_event_parks_its_stream_until_poll_answers(
    answer: bool, wants_usage: bool, ending: str
) -> None:
    """Guards parking: before a poll the client has exactly the events before the usage
    event, `on_usage` was not called, the loop was signalled and (`written-while-parked`) the
    engine is not read; the poll's answer releases the rest, the usage event forwarded and
    counted as the answer says, and the body's end, read while parked or after, ends it."""
    before = ROLE + PING  # no token: only the park signals the loop
    after = content("b") + content("c") + DONE
    wire = chunk_encode(before + USAGE + after, 4096)
    on_usage = Answer(answer)
    relay = fr.Relay()
    with sockets() as (engine, engine_peer, client, client_peer):
        stream = relay.start(engine.fileno(), client.fileno(), b"", False, wants_usage, on_usage)
        try:
            engine_peer.sendall(wire if ending == "same-write" else wire[: -len(END)])
            got = read_at_least(client_peer, len(before), bytearray())
            assert select.select([relay.fileno()], [], [], WAIT_S)[0]  # poll() has work
            if ending == "written-while-parked":
                engine_peer.sendall(END)
            select.select([client_peer], [], [], NOTHING_MORE_S)
            got += drain(client_peer)
            assert (bytes(got), on_usage.asked, stream.tokens) == (before, [], 0)
            assert stream.outcome == fr.RUNNING
            if ending == "written-while-parked":
                assert queued(engine) == len(END)  # the engine is not read while parked
            assert relay.poll() is None
            assert on_usage.asked == [USAGE]
            reported(relay, stream)
        finally:
            stream.cancel()
            relay.close()
        got += drain(client_peer)
    forwarded = not answer or wants_usage
    assert bytes(got) == before + (USAGE if forwarded else b"") + after
    assert (stream.outcome, stream.clean_end, stream.error) == (fr.ENDED, True, None)
    assert stream.tokens == 2 + (not answer)
    assert sum(n for _, n in stream.take()) == stream.tokens


def stress_body(rng: random.Random) -> bytes:
    """A random stream: maybe a role event, tokens with pings and usage-carrying tokens
    between them, maybe the usage chunk, then [DONE]."""
    events = [ROLE] if rng.random() < 0.5 else []
    for _ in range(rng.randint(0, 40)):
        kind = rng.random()
        text = f"t{rng.randint(0, 999)}"
        events.append(
            PING if kind < 0.1 else usage_with_choice(text, 3) if kind < 0.2 else content(text)
        )
    if rng.random() < 0.5:
        events.append(usage_only(rng.randint(0, 99), rng.random() < 0.5, rng.random() < 0.5))
    return b"".join([*events, DONE])


class Fed:
    """One stream of the stress test: its sockets, wire and what the test saw of it."""

    def __init__(self, rng: random.Random, socks: Any) -> None:
        self.engine, self.engine_peer, self.client, self.client_peer = socks
        self.body = stress_body(rng)
        self.wants_usage, self.chunked_out = rng.random() < 0.5, rng.random() < 0.5
        wire = chunk_encode(self.body, rng.randint(4, 64))
        cut = rng.choice([0, 0, rng.randint(0, len(wire))])
        self.initial, self.rest = wire[:cut], wire[cut:]
        self.keeper = UsageKeeper()
        self.stream: Any = None
        self.tokens_taken = 0
        self.cancel_asked = False
        self.reports = 0

    def take(self) -> None:
        self.tokens_taken += sum(n for _, n in self.stream.take())


def feed(fed: list[Fed], seed: int) -> None:
    """The engines: each wire written in order in pieces of 1-64 bytes, the streams' pieces
    interleaved at random."""
    rng = random.Random(seed)
    queues: list[list[bytes]] = []
    for one in fed:
        sizes = []
        while sum(sizes) < len(one.rest):
            sizes.append(rng.randint(1, 64))
        starts = [sum(sizes[:k]) for k in range(len(sizes))]
        queues.append([one.rest[at : at + size] for at, size in zip(starts, sizes, strict=True)])
    draws = [i for i, pieces in enumerate(queues) for _ in pieces]
    rng.shuffle(draws)
    taken = [0] * len(fed)
    for n, i in enumerate(draws):
        fed[i].engine_peer.sendall(queues[i][taken[i]])
        taken[i] += 1
        if n % 8 == 0:
            time.sleep(0.0005)  # spread the writes over the loop's work


def test_many_streams_fed_in_pieces_while_the_loop_starts_polls_takes_and_cancels() -> None:
    """Guards the hand-over between the relay thread and the loop under load: 64 streams fed
    by a writer thread in small random writes while the test starts, polls, takes records and
    cancels at random. Each stream ends once, ENDED (reported, everything relayed) or CANCELLED
    (asked for, not reported, a prefix of whole events relayed, its tokens counted); the
    records sum to the tokens, and no socket duplicate outlives the relay."""
    rng = random.Random(20261123)
    with contextlib.ExitStack() as stack:
        fed = [Fed(rng, stack.enter_context(sockets())) for _ in range(64)]
        baseline = open_fds()
        relay = fr.Relay()
        writer = threading.Thread(target=feed, args=(fed, rng.randint(0, 1 << 30)))
        writer.start()
        try:
            to_start, by_stream = list(fed), {}
            rng.shuffle(to_start)
            deadline = time.monotonic() + 3 * WAIT_S
            while (
                to_start
                or writer.is_alive()
                or any(
                    one.stream.outcome == fr.RUNNING
                    or (one.stream.outcome == fr.ENDED and not one.reports)
                    for one in fed
                )
            ):
                assert time.monotonic() < deadline, "the streams did not end in time"
                if to_start and rng.random() < 0.3:
                    one = to_start.pop()
                    one.stream = relay.start(
                        one.engine.fileno(),
                        one.client.fileno(),
                        one.initial,
                        one.chunked_out,
                        one.wants_usage,
                        one.keeper,
                    )
                    by_stream[one.stream] = one
                select.select([relay.fileno()], [], [], 0.001)
                for stream in relay.poll() or []:
                    by_stream[stream].reports += 1
                for stream in relay.take_dirty() or []:
                    by_stream[stream].take()
                running = [one for one in fed if one.stream is not None]
                if running and rng.random() < 0.2:
                    rng.choice(running).take()
                if running and rng.random() < 0.04:
                    one = rng.choice(running)
                    one.cancel_asked = True
                    one.stream.cancel()
            finished = caught_up(relay, lambda _: True, "a last poll")
            assert finished == []
            assert relay.active == 0
        finally:
            writer.join()
            for one in fed:
                if one.stream is not None:
                    one.stream.cancel()
            relay.close()
        assert open_fds() == baseline
        for one in fed:
            check_stress_stream(one)
    assert any(one.stream.outcome == fr.CANCELLED for one in fed)
    assert any(one.stream.outcome == fr.ENDED for one in fed)


def check_stress_stream(one: Fed) -> None:
    stream = one.stream
    one.take()
    assert one.tokens_taken == stream.tokens
    raw = drain(one.client_peer) + stream.take_unsent()
    got = b"".join(unchunk(raw)) if one.chunked_out else raw
    whole, _, usage, tokens = split_events(one.body, one.wants_usage)
    if stream.outcome == fr.ENDED:
        assert (one.reports, stream.clean_end, stream.error) == (1, True, None)
        assert (got, stream.tokens, one.keeper.usage) == (whole, tokens, usage)
    else:
        assert (stream.outcome, one.cancel_asked, one.reports) == (fr.CANCELLED, True, 0)
        assert whole.startswith(got)
        assert got == b"" or got.endswith(b"\n\n")  # whole events only
        assert stream.tokens == split_events(got, one.wants_usage)[3]


class Owner:
    """What holds a C stream in the sidecar (`NativeStream`): `on_usage` is its method."""

    def __init__(self) -> None:
        self.stream: Any = None

    def on_usage(self, event: bytes) -> bool:
        return read_usage_event(event)[1]


def end_stream(relay: Any, how: str, owner: Owner, socks: Any) -> None:
    """Starts `owner.stream` and ends it `how`, polling until it was reported if it is."""
    engine, engine_peer, client, client_peer = socks
    wire = chunk_encode(content("a") + DONE, 4096)
    initial = wire if how == "initial" else b""
    owner.stream = relay.start(
        engine.fileno(), client.fileno(), initial, True, False, owner.on_usage
    )
    stream = owner.stream
    if how == "engine":
        engine_peer.sendall(wire)
    elif how == "client":
        client_peer.close()
        engine_peer.sendall(wire)
    elif how == "parked":  # the park and the bytes before it are one step of the relay thread
        engine_peer.sendall(chunk_encode(content("a") + USAGE, 4096)[: -len(END)])
        read_at_least(client_peer, len(chunk_encode(content("a"), 4096)) - len(END), bytearray())
    if how in ("cancel", "parked"):
        stream.cancel()
    else:
        reported(relay, stream)


@pytest.mark.parametrize("how", ["engine", "initial", "client", "cancel", "parked"])
def test_an_ended_stream_is_freed_once_dropped(how: str) -> None:
    """Guards the relay's references: it holds each running stream (its thread may still name
    it in an event it fetched) and must let go after the next batch, by a poll, however the
    stream ended (`parked`: cancelled while its usage event awaits an answer). The stream and
    its owner are then freed by reference counting as soon as the sidecar drops them (each
    stream holds its relay: the relay's count shows the stream was freed). `on_usage` is a
    bound method of the stream's owner (`NativeStream`), a cycle broken when the stream ends so
    that reference counting alone frees it (the bench's sidecar grew by 50 MB in two minutes
    when it was not): the collector is off here."""
    relay = fr.Relay()
    gc.disable()  # reference counting alone must free them
    try:
        with sockets() as socks:
            baseline = sys.getrefcount(relay)
            owner = Owner()
            end_stream(relay, how, owner, socks)
            stream, alive = owner.stream, weakref.ref(owner)
            assert stream.outcome != fr.RUNNING
            let_go(relay, stream, 2)  # `stream` and `owner.stream`
            assert sys.getrefcount(relay) == baseline + 1
            del owner, stream
            assert (alive(), sys.getrefcount(relay)) == (None, baseline)
    finally:
        gc.enable()
        relay.close()


def test_a_stream_whose_on_usage_raised_is_freed_once_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As above, for a stream that `poll()` ended because its `on_usage` raised: that end
    comes from the loop's thread, which must wake the relay thread for the batch boundary
    that lets go of the stream (else, on an idle relay, it is never freed)."""
    monkeypatch.setattr(sys, "unraisablehook", lambda hook: None)

    def on_usage(event: bytes) -> bool:
        raise ValueError("a parser bug")

    relay = fr.Relay()
    try:
        with sockets() as (engine, engine_peer, client, _):
            stream = relay.start(engine.fileno(), client.fileno(), b"", True, False, on_usage)
            engine_peer.sendall(chunk_encode(USAGE, 4096))
            reported(relay, stream)
            assert stream.error == "the relay could not read a usage event"
            let_go(relay, stream, 1)
    finally:
        relay.close()


def test_each_relay_runs_one_thread_until_closed_or_dropped() -> None:
    """Guards the thread's lifecycle: one thread per Relay, gone once `close()` returned and
    once a Relay is dropped without it (its dealloc stops and joins the thread), also after it
    relayed a stream (ended, polled, let go); a leaked thread would hold its epoll set too."""
    before = tasks()
    relays, tids = [], []
    for _ in range(3):
        relays.append(fr.Relay())
        (tid,) = tasks() - before - set(tids)
        tids.append(tid)
    assert len(tasks() - before) == 3
    relays[0].close()
    eventually(lambda: tids[0] not in tasks(), "the closed relay's thread to end")
    relays[0].close()  # a no-op once closed
    del relays[1]  # dropped without close()
    eventually(lambda: tids[1] not in tasks(), "the dropped relay's thread to end")
    relay = relays.pop()
    relayed_one_stream(relay)
    streams_freed(relay, 1)  # ended, polled, let go of: they no longer hold the relay
    del relay
    eventually(lambda: tids[2] not in tasks(), "the dropped relay's thread to end")
    eventually(lambda: not tasks() - before, "every relay thread to end")


def test_close_ends_the_thread_when_asked_in_the_middle_of_a_batch() -> None:
    """Guards a lost wake-up: the relay thread lets go of its mutex between the events of one
    batch, so close() can ask it to stop in the middle of one; a wake-up event later in the same
    batch (a cancel's) then drained the stop's wake-up too, and the thread slept in epoll_wait
    for good: close() never returned. The process is held to one core and the relay thread runs
    at niceness 19, as on a busy node: the relay thread starts a long batch (many streams with a
    full engine buffer each, then a cancel's wake-up), the loop's thread wakes in the middle of
    it and takes the core, and the mutex as soon as it is let go; it cancels the rest and
    closes. close() runs on a thread of its own so that a hang fails the test, not hangs it."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})  # the relay thread inherits it
    try:
        for round_ in range(20):
            cancel_all_and_close(round_)
    finally:
        os.sched_setaffinity(0, allowed)


def cancel_all_and_close(round_: int) -> None:
    relay = fr.Relay(nice=19)
    wire = chunk_encode(content("a") * 500, 4096)
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(sockets()) for _ in range(48)]
        for _, engine_peer, _, _ in socks:
            engine_peer.sendall(wire)
        streams = [
            relay.start(engine.fileno(), client.fileno(), b"", True, False, UsageKeeper())
            for engine, _, client, _ in socks
        ]
        streams[0].cancel()  # its wake-up comes after every engine's bytes in the next batch
        time.sleep(0.0005)  # the relay thread starts that batch; this thread wakes within it
        for stream in streams[1:]:
            stream.cancel()
        closer = threading.Thread(target=relay.close, daemon=True)
        closer.start()
        closer.join(WAIT_S)
        assert not closer.is_alive(), f"close() hung in round {round_}"


def test_two_threads_closing_one_relay_at_once_both_return() -> None:
    """Guards shut_down running once: close() lets go of the GIL while it waits for the mutex
    and while it joins the relay thread, so a second close() on another thread could start a
    second shut_down and join the same thread twice (undefined; the second join never
    returned). Two closers at once, while two more threads keep the mutex busy with streams
    that end as they start; every thread must return."""
    ended_at_once = chunk_encode(content("a") + DONE, 4096)
    with sockets() as (engine, _, client, _):
        for round_ in range(60):
            relay = fr.Relay()
            go, stop = threading.Event(), threading.Event()

            def churn(relay: Any = relay, stop: threading.Event = stop) -> None:
                while not stop.is_set():
                    with contextlib.suppress(ValueError):  # closed
                        relay.start(
                            engine.fileno(), client.fileno(), ended_at_once, True, False, bool
                        )
                    relay.take_dirty()  # the mutex again

            def close(relay: Any = relay, go: threading.Event = go) -> None:
                go.wait()
                relay.close()

            churners = [threading.Thread(target=churn, daemon=True) for _ in range(2)]
            closers = [threading.Thread(target=close, daemon=True) for _ in range(2)]
            for thread in churners + closers:
                thread.start()
            time.sleep(0.002)
            go.set()
            for thread in closers:
                thread.join(WAIT_S)
            stop.set()
            for thread in churners:
                thread.join(WAIT_S)
            alive = [thread for thread in churners + closers if thread.is_alive()]
            assert not alive, f"round {round_}: {len(alive)} threads never returned"


def test_an_on_usage_that_cancels_its_own_stream_is_asked_once() -> None:
    """Guards consuming a usage event before asking about it: an on_usage that cancels its own
    stream made cancel() ask on_usage again about the same event, which cancelled again, and
    so on (the sidecar's on_usage does not cancel; a caller's may)."""
    asked: list[bytes] = []
    stream: Any = None

    def on_usage(event: bytes) -> bool:
        asked.append(event)
        stream.cancel()
        return True

    relay = fr.Relay()
    with sockets() as (engine, engine_peer, client, _):
        stream = relay.start(engine.fileno(), client.fileno(), b"", True, False, on_usage)
        engine_peer.sendall(chunk_encode(content("a") + USAGE, 4096))
        caught_up(relay, lambda _: bool(asked), "on_usage to be asked")
        assert (asked, stream.outcome) == ([USAGE], fr.CANCELLED)
    relay.close()


def test_a_relay_dropped_before_its_last_poll_is_collected_and_ends_its_thread() -> None:
    """Guards the relay's garbage-collector support: a Relay dropped without close() while an
    ended stream awaits its report is in a cycle (the stream holds its relay for its mutex, the
    relay holds the stream until a poll). Before both types were tracked, the collector could not
    see it: the relay, its thread, epoll set and eventfds leaked."""
    before, fds = tasks(), open_fds()
    relay = fr.Relay()
    with sockets() as (engine, _, client, _):
        wire = chunk_encode(content("a") + DONE, 4096)
        stream = relay.start(engine.fileno(), client.fileno(), wire, True, False, UsageKeeper())
        assert stream.outcome == fr.ENDED
    del stream, relay
    gc.collect()
    eventually(lambda: not tasks() - before, "the dropped relay's thread to end", 1)
    assert open_fds() == fds


def relayed_tokens(relay: Any, stream: Any, tokens: int) -> None:
    caught_up(relay, lambda _: stream.tokens == tokens, f"{tokens} tokens to be relayed")


def test_a_relay_dropped_with_streams_running_cancels_them_when_collected() -> None:
    """A Relay dropped without close() with a stream still running, whose on_usage refers back
    to the relay (as the sidecar's does, through its NativeRelay): a cycle the collector frees,
    cancelling the stream (its socket duplicates closed, so the client's peer is not held open)
    and ending the thread."""
    before, fds = tasks(), open_fds()

    class Holder:
        def __init__(self) -> None:
            self.relay = fr.Relay()
            self.stream: Any = None

        def on_usage(self, event: bytes) -> bool:
            return True

    with sockets() as (engine, engine_peer, client, _):
        holder = Holder()
        holder.stream = holder.relay.start(
            engine.fileno(), client.fileno(), b"", True, False, holder.on_usage
        )
        engine_peer.sendall(chunk_encode(content("a"), 4096).removesuffix(END))  # still running
        relayed_tokens(holder.relay, holder.stream, 1)
        assert (holder.stream.outcome, holder.relay.active) == (fr.RUNNING, 1)
        del holder
        gc.collect()
        eventually(lambda: not tasks() - before, "the dropped relay's thread to end", 1)
        assert open_fds() == fds + 4  # the test's sockets only: the relay's duplicates closed
    assert open_fds() == fds


def test_the_relay_thread_runs_at_the_niceness_asked() -> None:
    """Guards `Relay(nice=...)`: the relay thread (not the event loop's, nor the process)
    takes the niceness it is given, which yields the core to the loop's admission work; 0
    leaves it as it was inherited; outside 0-19 is refused."""
    main = str(threading.get_native_id())
    main_nice = nice_of(main)
    with relay_thread(nice=19) as (_, tid):
        eventually(lambda: nice_of(tid) == 19, "the relay thread at nice 19")
        assert nice_of(main) == main_nice
    with relay_thread() as (_, tid):
        assert nice_of(tid) == main_nice
    before = tasks()
    for nice in (20, -1):
        with pytest.raises(ValueError, match="nice must be between 0 and 19"):
            fr.Relay(nice=nice)
    assert tasks() - before == set()


def test_the_relay_thread_blocks_every_signal() -> None:
    """Guards the signal mask: every signal that can be blocked is blocked in the relay thread,
    so the kernel delivers SIGINT, SIGTERM and the others to Python's threads (Python handles
    them on its main thread), and the creating thread's mask is as it was."""
    main = str(threading.get_native_id())
    main_mask = proc_field(main, "SigBlk")
    with relay_thread() as (relay, tid):
        relayed_one_stream(relay)  # before its first loop the thread has glibc's mask: all
        mask = int(proc_field(tid, "SigBlk"), 16)
        assert proc_field(main, "SigBlk") == main_mask
    glibc_own = range(32, signal.SIGRTMIN)  # reserved by the C library's threads
    unblockable = (signal.SIGKILL, signal.SIGSTOP, *glibc_own)
    for number in range(1, signal.SIGRTMAX + 1):
        if number not in unblockable:
            assert mask >> (number - 1) & 1, f"signal {number} is not blocked"


def test_fileno_is_readable_once_tokens_were_relayed_without_a_poll() -> None:
    """Guards the loop's wake-up for token records: `fileno()` is not readable before
    anything happened and becomes readable (`has_dirty`) when the relay thread counted a token,
    with no poll called; after a poll and take_dirty, the next token wakes the loop again."""
    relay = fr.Relay()
    with sockets() as (engine, engine_peer, client, client_peer):
        stream = relay.start(engine.fileno(), client.fileno(), b"", False, False, UsageKeeper())
        try:
            for text in ("a", "b"):
                assert select.select([relay.fileno()], [], [], 0)[0] == []
                assert not relay.has_dirty
                engine_peer.sendall(chunk_encode(content(text), 4096)[: -len(END)])
                assert select.select([relay.fileno()], [], [], WAIT_S)[0] == [relay.fileno()]
                assert relay.has_dirty
                assert relay.take_dirty() == [stream]
                assert [n for _, n in stream.take()] == [1]
                assert relay.poll() is None
            assert drain(client_peer) == content("a") + content("b")
        finally:
            stream.cancel()
            relay.close()
