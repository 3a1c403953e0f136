"""Fuzzed JSONL through the whole API: upload, create, wait, read the files.

Whatever the input, the batch ends `completed` with exactly one result per line, or `failed`
with every bad line named in `errors` and in the error file. The service (and the stub engine)
run on an event loop in a background thread so hypothesis can drive the sync openai client.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetwarden.batch.service import BatchService
from fleetwarden.batch.validation import split_lines
from tests.batch.builders import chat_line
from tests.batch.harness import TOKEN_A, service_config, sqlite_store
from tests.batch.stub_engine import StubEngine


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=30)

    engine: StubEngine = run(StubEngine().start())
    directory: Path = tmp_path_factory.mktemp("fuzz")
    config = service_config(
        sqlite_store(directory),
        engine.base_url,
        limits={"max_line_bytes": 300},
        dispatch={"signal_interval_s": 0.005, "maintenance_interval_s": 0.02},
        retry={"base_delay_s": 0.05, "max_delay_s": 0.2},
    )

    async def start() -> BatchService:
        service = BatchService(config)
        await service.start("127.0.0.1", 0)
        return service

    service: BatchService = run(start())
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{service.port}/v1", api_key=TOKEN_A, max_retries=0, timeout=30
    )
    try:
        yield client
    finally:
        client.close()
        run(service.stop())
        run(engine.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


_lines = st.one_of(
    st.builds(lambda cid: json.dumps(chat_line(cid)).encode(), st.text(min_size=1, max_size=6)),
    st.binary(max_size=30).filter(lambda b: b"\n" not in b),
    st.builds(
        lambda cid, pad: json.dumps(chat_line(cid, note="x" * pad)).encode(),
        st.text(min_size=1, max_size=6),
        st.integers(0, 400),
    ),
    st.builds(
        lambda cid, url: json.dumps({**chat_line(cid), "url": url}).encode(),
        st.text(min_size=1, max_size=6),
        st.sampled_from(["/v1/completions", "/v1/embeddings", ""]),
    ),
)


@pytest.mark.slow
@pytest.mark.timeout(180)
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lines=st.lists(_lines, min_size=1, max_size=8))
def test_fuzzed_input_completes_whole_or_fails_naming_each_bad_line(
    api: openai.OpenAI, lines: list[bytes]
) -> None:
    content = b"\n".join(lines) + b"\n"
    n = len(split_lines(content))
    uploaded = api.files.create(file=("fuzz.jsonl", content), purpose="batch")
    batch = api.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    for _ in range(500):
        batch = api.batches.retrieve(batch.id)
        if batch.status in {"completed", "failed"}:
            break
        time.sleep(0.02)
    assert batch.status in {"completed", "failed"}
    assert batch.request_counts is not None
    assert batch.request_counts.total == n

    def rows(file_id: str | None) -> list[dict[str, object]]:
        if file_id is None:
            return []
        # JSONL splits on "\n" only; str.splitlines() would also split inside JSON strings that
        # hold U+2028, U+0085 and other characters Python counts as line breaks.
        text = api.files.content(file_id).text
        return [json.loads(line) for line in text.split("\n") if line]

    if batch.status == "completed":
        results = rows(batch.output_file_id) + rows(batch.error_file_id)
        assert len(results) == n
        assert batch.request_counts.completed + batch.request_counts.failed == n
        return
    assert batch.errors is not None
    assert batch.errors.data
    named = [e.line for e in batch.errors.data]
    assert all(line is not None and 1 <= line <= n for line in named)
    assert len(set(named)) == len(named)
    assert [r["error"]["line"] for r in rows(batch.error_file_id)] == named  # type: ignore[index]
