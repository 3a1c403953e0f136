"""Smoke tests of the real vLLM engine (CPU build) that the sidecar's end-to-end suite runs on.

Why: the sidecar's behaviour against the stub engine only means something if the stub behaves
like vLLM. These tests pin down the vLLM facts the sidecar relies on, on the same engine the
sidecar's real-engine tests use: the OpenAI routes answer, streamed usage is exact, the metric
names exist, and concurrent requests really fill the KV cache and queue. Skipped, with the
install command in the reason, where .venv-vllm is missing.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from tests.support.vllm_engine import VllmEngine

# The first test's budget includes the session fixture: model build plus engine start.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=120)
KV_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
QUEUE_TIME_SUM = "vllm:request_queue_time_seconds_sum"
MIN_QUEUED_S = 0.05
"""Total time in vLLM's waiting queue that shows a prompt waited for cache room (8 requests
that all fit spend well under a millisecond each there)."""


def _gauges(text: str) -> dict[str, float]:
    """Unlabelled view of a Prometheus exposition: metric name -> value (last sample wins)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        values[name_part.split("{", 1)[0]] = float(value)
    return values


def _kv_usage(metrics: dict[str, float]) -> float:
    """KV-cache usage in [0, 1] under the current name, or the pre-0.10 one."""
    return metrics.get(KV_GAUGES[0], metrics.get(KV_GAUGES[1], 0.0))


async def _metrics(session: aiohttp.ClientSession, engine: VllmEngine) -> dict[str, float]:
    async with session.get(f"{engine.base_url}/metrics") as resp:
        assert resp.status == 200
        return _gauges(await resp.text())


async def _settled_metrics(
    session: aiohttp.ClientSession,
    engine: VllmEngine,
    before: dict[str, float],
    generated: int,
) -> dict[str, float]:
    """/metrics once it counts the `generated` tokens since `before`: a busy engine's counters
    can lag the responses its clients already have, and a stale snapshot misses preemptions."""
    deadline = time.monotonic() + 60
    while True:
        now = await _metrics(session, engine)
        new_tokens = now["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
        if new_tokens >= generated or time.monotonic() > deadline:
            return now
        await asyncio.sleep(0.2)


@dataclass
class _Stream:
    """What one streamed completion delivered."""

    text_chunks: int = 0
    text: str = ""
    usage: dict[str, int] = field(default_factory=dict)
    finish_reason: str | None = None
    first_s: float | None = None
    """Monotonic time of the first and the last event (to see streams overlap in time)."""
    last_s: float | None = None


async def _stream_completion(
    session: aiohttp.ClientSession, engine: VllmEngine, body: dict[str, Any]
) -> _Stream:
    """Posts a streaming /v1/completions request and collects its SSE events."""
    out = _Stream()
    async with session.post(f"{engine.base_url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["content-type"].startswith("text/event-stream")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[len(b"data: ") :])
            out.last_s = time.monotonic()
            if out.first_s is None:
                out.first_s = out.last_s
            if event.get("usage"):
                out.usage = event["usage"]
            for choice in event["choices"]:
                out.text_chunks += 1
                out.text += choice["text"]
                out.finish_reason = choice["finish_reason"] or out.finish_reason
    return out


async def test_models_chat_stream_and_metrics(vllm_engine: VllmEngine) -> None:
    """The routes and metric names the sidecar proxies and scrapes exist, and usage is exact."""
    engine = vllm_engine
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session:
        async with session.get(f"{engine.base_url}/v1/models") as resp:
            models = await resp.json()
        assert [m["id"] for m in models["data"]] == [engine.model]

        chat = {
            "model": engine.model,
            "messages": [{"role": "user", "content": engine.filler(20)}],
            "max_tokens": 16,
        }
        async with session.post(f"{engine.base_url}/v1/chat/completions", json=chat) as resp:
            assert resp.status == 200, await resp.text()
            reply = await resp.json()
        assert reply["choices"][0]["finish_reason"] == "length"
        assert reply["choices"][0]["message"]["content"]
        # The template wraps the 20 filler tokens in "<s>user: ... </s>assistant:".
        assert reply["usage"]["completion_tokens"] == 16
        assert reply["usage"]["prompt_tokens"] > 20

        # vLLM's own `priority` field is accepted (and ignored under its default FCFS policy).
        with_priority = {**chat, "priority": 5, "max_tokens": 2}
        async with session.post(
            f"{engine.base_url}/v1/chat/completions", json=with_priority
        ) as resp:
            assert resp.status == 200, await resp.text()

        # Streaming with include_usage: the last event carries exact totals. Without ignore_eos,
        # since the tiny model can never sample </s>, it still runs to max_tokens.
        for extra in ({}, {"ignore_eos": True}):
            body = {
                "model": engine.model,
                "prompt": engine.filler(100),
                "max_tokens": 40,
                "stream": True,
                "stream_options": {"include_usage": True},
                **extra,
            }
            stream = await _stream_completion(session, engine, body)
            assert stream.usage == {
                "prompt_tokens": 101,  # the filler plus the BOS the tokenizer adds
                "completion_tokens": 40,
                "total_tokens": 141,
            }
            assert stream.finish_reason == "length"
            assert 1 <= stream.text_chunks <= 40
            assert stream.text

        metrics = await _metrics(session, engine)
    assert any(name in metrics for name in KV_GAUGES), sorted(metrics)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert name in metrics, name
    assert metrics["vllm:generation_tokens_total"] >= 16 + 2 * 40


@dataclass
class FillRun:
    """One burst of parallel streams and what vLLM's /metrics said during and after it."""

    streams: list[_Stream]
    samples: list[dict[str, float]]
    kv_peak: float
    waiting_peak: float
    running_peak: float
    preemptions: float
    queued_s: float
    summary: str

    @property
    def contended(self) -> bool:
        """Some prompt waited for cache room, the cache filled, or requests were preempted."""
        waited = self.waiting_peak > 0 or self.queued_s >= MIN_QUEUED_S
        return waited or self.kv_peak >= 0.9 or self.preemptions > 0


async def _fill_burst(
    engine: VllmEngine, n_requests: int, prompt_tokens: int, output_tokens: int
) -> FillRun:
    body = {
        "model": engine.model,
        "prompt": engine.filler(prompt_tokens - 1),  # + BOS = prompt_tokens
        "max_tokens": output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    samples: list[dict[str, float]] = []
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session:
        before = await _metrics(session, engine)
        done = asyncio.Event()

        async def sample() -> None:
            while not done.is_set():
                samples.append(await _metrics(session, engine))
                await asyncio.sleep(0.02)

        sampler = asyncio.create_task(sample())
        started = time.monotonic()
        try:
            streams = await asyncio.gather(
                *(_stream_completion(session, engine, body) for _ in range(n_requests))
            )
        finally:
            done.set()
            await sampler
        elapsed = time.monotonic() - started
        after = await _settled_metrics(session, engine, before, n_requests * output_tokens)
    kv_peak = max(_kv_usage(s) for s in samples)
    waiting_peak = max(s["vllm:num_requests_waiting"] for s in samples)
    running_peak = max(s["vllm:num_requests_running"] for s in samples)
    preemptions = after["vllm:num_preemptions_total"] - before["vllm:num_preemptions_total"]
    queued_s = after[QUEUE_TIME_SUM] - before[QUEUE_TIME_SUM]
    summary = (
        f"{len(samples)} samples in {elapsed:.1f} s: kv peak {kv_peak:.3f}, waiting peak "
        f"{waiting_peak:.0f}, running peak {running_peak:.0f}, preemptions {preemptions:.0f}, "
        f"time in vLLM's waiting queue {queued_s:.3f} s"
    )
    print(summary)
    return FillRun(
        list(streams), samples, kv_peak, waiting_peak, running_peak, preemptions, queued_s, summary
    )


async def test_concurrent_streams_fill_the_kv_cache(vllm_engine: VllmEngine) -> None:
    """Enough parallel streams fill the small KV cache: requests wait, or usage nears 1.0.

    Sixteen requests of 256 prompt + 256 output tokens need 16 x 16 blocks, four times the
    cache's 63 usable blocks: their prompts alone need twice the cache, so some wait, and the
    running ones preempt each other as they grow. (Eight, twice the cache, once ran with at most
    two in flight on a loaded CI machine, the clients' requests arriving too far apart, and
    showed no contention in three bursts.) /metrics is sampled while they run. Also pins
    down how vLLM reports usage: used blocks / usable blocks, so always a multiple of 1/63.
    """
    engine = vllm_engine
    n_requests, prompt_tokens, output_tokens = 16, 256, 256
    assert n_requests * prompt_tokens > engine.usable_kv_tokens
    # /metrics answers slowly while the engine is busy on a loaded CPU, so the sampler may miss
    # the busy stretch (a CI run once got two samples, both idle), and on a starved CI machine a
    # burst once showed neither waiting time nor preemptions in vLLM's counters either (2 samples
    # in 7.2 s). A burst that shows no contention at all is run again, up to three times; every
    # attempt's figures are printed, and the test fails if none shows any.
    attempts: list[FillRun] = []
    for _ in range(3):
        attempts.append(run := await _fill_burst(engine, n_requests, prompt_tokens, output_tokens))
        for stream in run.streams:
            assert stream.usage["prompt_tokens"] == prompt_tokens
            assert stream.usage["completion_tokens"] == output_tokens
        if run.contended:
            break
    assert run.contended, [attempt.summary for attempt in attempts]
    # Continuous batching: the sampler saw two running, or two streams overlapped at the client,
    # or vLLM preempted (it preempts a running request only for another running one). The last is
    # the evidence that survives a starved client: a CI run read each stream's buffered events in
    # one go (no overlap) with the sampler at 2 samples, while vLLM counted 10 preemptions.
    spans = [(st.first_s, st.last_s) for st in run.streams if st.first_s and st.last_s]
    overlapping = any(a[0] < b[1] and b[0] < a[1] for a in spans for b in spans if a is not b)
    batched = run.running_peak > 1 or overlapping or run.preemptions > 0
    assert batched, f"no continuous batching seen: {run.summary}"
    usable_blocks = engine.num_blocks - 1
    for attempt in attempts:
        for s in attempt.samples:
            used_blocks = _kv_usage(s) * usable_blocks
            assert abs(used_blocks - round(used_blocks)) < 1e-6, (_kv_usage(s), usable_blocks)
