"""The streaming relay's hot path: byte-scan token counting, the lock-free inter-token histogram
and direct writes to the client's transport must change nothing a client or a scrape can see.
"""

from __future__ import annotations

import asyncio
import itertools
import json

import aiohttp
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from fleetwarden.sidecar.metrics import _TOKEN_GAP_BUCKETS, LoopHistogram
from fleetwarden.sidecar.stream import plain_tokens, split_events
from tests.sidecar.sse_events import COMMENT, DONE, ROLE, USAGE, token
from tests.support.sidecar_stack import running_sidecar, running_stub


def relay_reads(reads: list[bytes], wants_usage: bool) -> tuple[bytes, int, object]:
    """What the relay loop does with successive reads: (bytes forwarded, tokens, usage)."""
    out, pending, tokens, usage = b"", b"", 0, None
    for data in reads:
        data, pending = pending + data, b""
        n = plain_tokens(data)
        if n < 0:
            data, pending, found, n = split_events(data, wants_usage)
            usage = found if found is not None else usage
        out, tokens = out + data, tokens + n
    assert pending == b""
    return out, tokens, usage


# Token texts include what could fool a byte scan: quotes, newlines, `data:` and the markers.
texts = st.lists(
    st.sampled_from(
        ["t", " a", "data: x", "\n\ndata:", '"usage":{', '"role":"assistant"', "[DONE]", "é"]
    ),
    min_size=0,
    max_size=12,
)


@given(texts, st.lists(st.integers(0, 4000), max_size=8), st.booleans(), st.booleans())
def test_any_cut_of_a_stream_counts_and_forwards_like_the_per_event_path(
    contents: list[str], cuts: list[int], comment: bool, wants_usage: bool
) -> None:
    events = [ROLE, *(token(t) for t in contents)]
    if comment:
        events.insert(1, COMMENT)
    stream = b"".join([*events, USAGE % len(contents), DONE])
    bounds = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    reads = [stream[a:b] for a, b in itertools.pairwise(bounds) if b > a]

    out, tokens, usage = relay_reads(reads, wants_usage)

    assert tokens == len(contents)
    assert usage == {"prompt_tokens": 3, "completion_tokens": len(contents)}
    usage_event = USAGE % len(contents) if wants_usage else b""
    assert out == b"".join([*events, usage_event, DONE])


def test_plain_reads_take_the_byte_scan() -> None:
    assert plain_tokens(token("a") + token("b") + token("c")) == 3
    assert plain_tokens(token("a") + COMMENT) == 1
    for not_plain in (ROLE, USAGE % 1, DONE, token("a")[:-1], token("a") + DONE):
        assert plain_tokens(not_plain) == -1


def test_loop_histogram_exposition_equals_prometheus_clients() -> None:
    reference_registry, registry = CollectorRegistry(), CollectorRegistry()
    reference = Histogram(
        "gaps_seconds", "Gaps.", ["model", "region"], buckets=_TOKEN_GAP_BUCKETS,
        registry=reference_registry,
    ).labels("m", "r")  # fmt: skip
    ours = LoopHistogram("gaps_seconds", "Gaps.", {"model": "m", "region": "r"}, _TOKEN_GAP_BUCKETS)
    registry.register(ours)
    for value in (0.0, 0.005, 0.0051, 0.02, 0.3, 1.0, 2.5, 7.0):  # on and between bounds
        reference.observe(value)
        ours.observe(value)
    # `_created` is switched off process-wide by SidecarMetrics, maybe not yet in this process.
    reference_text = b"".join(
        line for line in generate_latest(reference_registry).splitlines(True)
        if b"_created" not in line
    )  # fmt: skip
    assert generate_latest(registry) == reference_text


def _sample(text: str, prefix: str) -> float:
    return float(next(line for line in text.splitlines() if line.startswith(prefix)).split()[-1])


async def test_metrics_show_a_finished_streams_tokens_and_gaps_exactly() -> None:
    tokens_line = (
        'fleetwarden_tokens_total{app="hot",kind="output",model="stub-model",region="local",'
        'tenant="acme",tier="iw-n"}'
    )
    count, inf = (
        "fleetwarden_inter_token_seconds_count{",
        'fleetwarden_inter_token_seconds_bucket{le="+Inf"',
    )
    scrapes = []
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        async with aiohttp.ClientSession() as http:
            for tokens in (7, 5):
                body = {
                    "model": "stub-model",
                    "messages": [{"role": "user", "content": "x"}],
                    "max_tokens": tokens,
                    "stream": True,
                }
                headers = {"x-fleetwarden-tenant": "acme", "x-fleetwarden-app": "hot"}
                async with http.post(
                    f"{sc.url}/v1/chat/completions", json=body, headers=headers
                ) as r:
                    assert (await r.text()).count('"content":"t') == tokens
                async with http.get(f"{sc.url}/metrics") as r:
                    scrapes.append(await r.text())
    first, second = scrapes
    assert _sample(first, tokens_line) == 7
    assert _sample(second, tokens_line) == 12
    # One gap per read that carried tokens after a stream's first: at most tokens - 1 each.
    assert 1 <= _sample(first, count) <= 6
    assert _sample(first, count) < _sample(second, count) <= 6 + 4
    assert _sample(second, inf) == _sample(second, count)
    assert _sample(second, "fleetwarden_inter_token_seconds_sum{") > 0


async def test_http10_client_gets_the_whole_stream_unchunked() -> None:
    """No chunked framing for an HTTP/1.0 client: the direct write is not used there."""
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        host, port = sc.url.removeprefix("http://").split(":")
        body = json.dumps(
            {"model": "stub-model", "messages": [{"role": "user", "content": "x"}],
             "max_tokens": 6, "stream": True}
        ).encode()  # fmt: skip
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
        )
        raw = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200")
    assert b"transfer-encoding" not in head.lower()
    events = [e for e in payload.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    assert payload.count(b'"content":"t') == 6
