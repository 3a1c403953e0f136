"""The Batch API through the official `openai` client: the shapes existing clients rely on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetwarden.batch.service import BatchService
from tests.batch.builders import MODEL, chat_line, jsonl
from tests.batch.harness import (
    TOKEN_A,
    TOKEN_B,
    client,
    running_service,
    service_config,
    sqlite_store,
)
from tests.batch.stub_engine import StubEngine
from tests.support.redis_server import RedisServer


@pytest.fixture
async def service(tmp_path: Path, engine: StubEngine) -> AsyncIterator[BatchService]:
    config = service_config(
        sqlite_store(tmp_path),
        engine.base_url,
        quotas={"tenants": {"team-b": {"max_queued_items": 5, "max_file_bytes": 2048}}},
        limits={"max_line_bytes": 400},
    )
    async with running_service(config) as running:
        yield running


async def wait_for_status(
    api: openai.AsyncOpenAI, batch_id: str, statuses: set[str], seen: list[str] | None = None
) -> Any:
    for _ in range(1000):
        batch = await api.batches.retrieve(batch_id)
        if seen is not None and (not seen or seen[-1] != batch.status):
            seen.append(batch.status)
        if batch.status in statuses:
            return batch
        await asyncio.sleep(0.02)
    raise AssertionError(f"batch {batch_id} never reached {statuses}")


async def download(api: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    content = await api.files.content(file_id)
    return [json.loads(line) for line in content.text.splitlines()]


async def run_the_flow(service: BatchService, engine: StubEngine) -> None:
    api = client(service)
    lines = [chat_line(f"q-{i}") for i in range(12)]
    uploaded = await api.files.create(file=("questions.jsonl", jsonl(lines)), purpose="batch")
    assert (uploaded.object, uploaded.purpose, uploaded.filename) == (
        "file", "batch", "questions.jsonl",
    )  # fmt: skip
    assert uploaded.bytes == len(jsonl(lines))
    assert (await api.files.retrieve(uploaded.id)).id == uploaded.id
    batch = await api.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "nightly-eval"},
    )
    assert batch.status == "validating"
    assert batch.request_counts is not None
    assert batch.request_counts.total == 12
    assert batch.expires_at == batch.created_at + 86400
    seen: list[str] = []
    done = await wait_for_status(api, batch.id, {"completed", "failed"}, seen)
    assert done.status == "completed", done.errors
    assert seen[-1] == "completed"
    assert set(seen) <= {"validating", "in_progress", "finalizing", "completed"}
    assert done.request_counts.model_dump() == {"total": 12, "completed": 12, "failed": 0}
    assert done.model == MODEL
    assert done.metadata == {"job": "nightly-eval"}
    assert done.in_progress_at is not None
    assert done.completed_at is not None
    assert done.error_file_id is None
    assert done.usage is not None
    assert done.usage.output_tokens == 12 * 7
    output = await download(api, done.output_file_id)
    assert [row["custom_id"] for row in output] == [f"q-{i}" for i in range(12)]
    for row in output:
        assert row["id"].startswith("batch_req_")
        assert row["error"] is None
        assert row["response"]["status_code"] == 200
        assert row["response"]["request_id"] == f"req-{row['custom_id']}"
        assert row["response"]["body"]["choices"][0]["message"]["content"] == (
            f"echo {row['custom_id']}"
        )
    output_file = await api.files.retrieve(done.output_file_id)
    assert output_file.purpose == "batch_output"
    assert sum(engine.calls.values()) == 12
    assert {tier for tiers in engine.tiers.values() for tier in tiers} == {"niw"}


async def test_the_openai_client_runs_a_batch_end_to_end(
    service: BatchService, engine: StubEngine
) -> None:
    await run_the_flow(service, engine)


async def test_the_same_flow_on_redis(
    tmp_path: Path, engine: StubEngine, redis_server: RedisServer
) -> None:
    config = service_config({"kind": "redis", "url": redis_server.url}, engine.base_url)
    async with running_service(config) as running:
        await run_the_flow(running, engine)


async def test_listing_batches_paginates_newest_first(service: BatchService) -> None:
    api = client(service)
    uploaded = await api.files.create(file=("a.jsonl", jsonl([chat_line("x")])), purpose="batch")
    created = [
        (await api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")).id
        for _ in range(5)
    ]  # fmt: skip
    page = await api.batches.list(limit=2)
    assert [b.id for b in page.data] == created[:-3:-1]
    assert page.has_more
    every = [b.id async for b in await api.batches.list(limit=2)]
    assert every == created[::-1]
    files = (await api.files.list()).data
    assert files[-1].id == uploaded.id  # newest first: the batches' output files come before
    assert {f.purpose for f in files[:-1]} <= {"batch_output"}


async def test_bad_lines_fail_the_batch_and_each_is_named(service: BatchService) -> None:
    api = client(service)
    good = chat_line("ok-1")
    lines = [
        json.dumps(good),
        "{not json",
        json.dumps({**chat_line("x"), "custom_id": None}),
        json.dumps(chat_line("ok-1")),
        json.dumps({**chat_line("wrong-url"), "url": "/v1/completions"}),
        json.dumps({**chat_line("wrong-method"), "method": "GET"}),
        json.dumps(chat_line("huge", extra="y" * 500)),
        json.dumps(chat_line("other-model", model="gpt-unknown")),
        "",
        json.dumps(chat_line("ok-2")),
    ]
    content = ("\n".join(lines) + "\n").encode()
    uploaded = await api.files.create(file=("bad.jsonl", content), purpose="batch")
    batch = await api.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    failed = await wait_for_status(api, batch.id, {"failed", "completed", "in_progress"})
    assert failed.status == "failed"
    assert failed.errors is not None
    assert failed.errors.data is not None
    named = [(e.line, e.code) for e in failed.errors.data]
    assert named == [
        (2, "invalid_json"),
        (3, "missing_custom_id"),
        (4, "duplicate_custom_id"),
        (5, "invalid_url"),
        (6, "invalid_method"),
        (7, "line_too_large"),
        (8, "model_not_found"),
        (9, "invalid_json"),
    ]
    assert failed.failed_at is not None
    errors = await download(api, failed.error_file_id)
    assert [row["error"]["line"] for row in errors] == [2, 3, 4, 5, 6, 7, 8, 9]
    assert errors[2]["custom_id"] == "ok-1"
    assert all(row["response"] is None for row in errors)


async def test_requests_without_a_valid_token_are_refused(service: BatchService) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        await client(service, token="sk-wrong").batches.list()
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"
    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{service.port}/v1/batches"
        async with session.get(url) as response:
            assert response.status == 401
            body = await response.json()
            assert body["error"]["type"] == "invalid_request_error"


async def test_tenants_see_only_their_own_files_and_batches(service: BatchService) -> None:
    api_a, api_b = client(service, TOKEN_A), client(service, TOKEN_B)
    uploaded = await api_a.files.create(file=("a.jsonl", jsonl([chat_line("x")])), purpose="batch")
    batch = await api_a.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    with pytest.raises(openai.NotFoundError):
        await api_b.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        await api_b.files.content(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        await api_b.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert (await api_b.batches.list()).data == []


async def test_quotas_bound_files_and_queued_items(
    service: BatchService, engine: StubEngine
) -> None:
    engine.kv_usage = 0.95  # busy: nothing finishes, so queued items stay counted
    api = client(service, TOKEN_B)  # team-b: 5 queued items, 2048-byte files
    with pytest.raises(openai.APIStatusError) as too_big:
        await api.files.create(file=("big.jsonl", b"x" * 4096), purpose="batch")
    assert too_big.value.status_code == 413
    three = await api.files.create(
        file=("three.jsonl", jsonl([chat_line(f"c{i}") for i in range(3)])), purpose="batch"
    )
    await api.batches.create(
        input_file_id=three.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    with pytest.raises(openai.RateLimitError) as over:
        await api.batches.create(
            input_file_id=three.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert over.value.code == "max_queued_items_exceeded"


async def test_bad_batch_requests_are_refused_with_openai_errors(service: BatchService) -> None:
    api = client(service)
    uploaded = await api.files.create(file=("a.jsonl", jsonl([chat_line("x")])), purpose="batch")
    cases: list[dict[str, Any]] = [
        {"endpoint": "/v1/embeddings"},
        {"completion_window": "forever"},
        {"completion_window": "9999d"},
        {"metadata": {"region": "mars"}},
        {"metadata": {"k": "v" * 600}},
    ]
    for case in cases:
        args = {"input_file_id": uploaded.id, "endpoint": "/v1/chat/completions",
                "completion_window": "24h", **case}  # fmt: skip
        with pytest.raises(openai.BadRequestError):
            await api.batches.create(**args)
    with pytest.raises(openai.BadRequestError) as purpose:
        await api.files.create(file=("a.jsonl", b"{}"), purpose="fine-tune")
    assert purpose.value.code == "invalid_purpose"
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN_A}"}) as s:
        base = f"http://127.0.0.1:{service.port}"
        for method, path, status in [
            ("GET", "/v1/nothing-here", 404),
            ("PUT", "/v1/batches", 405),
            ("POST", "/v1/batches", 400),
            ("POST", "/v1/files", 400),
            ("GET", "/v1/batches?limit=1000", 400),
        ]:
            async with s.request(method, base + path, data=b"[") as response:
                assert response.status == status, path
                assert set((await response.json())["error"]) == {"message", "type", "param",
                                                                  "code"}  # fmt: skip


async def test_cancel_through_the_client(tmp_path: Path, engine: StubEngine) -> None:
    engine.kv_usage = 0.95  # the region is busy: nothing is released
    config = service_config(sqlite_store(tmp_path), engine.base_url)
    async with running_service(config) as service:
        api = client(service)
        content = jsonl([chat_line(f"c{i}") for i in range(4)])
        uploaded = await api.files.create(file=("c.jsonl", content), purpose="batch")
        batch = await api.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        await wait_for_status(api, batch.id, {"in_progress"})
        cancelling = await api.batches.cancel(batch.id)
        assert cancelling.status in {"cancelling", "cancelled"}
        done = await wait_for_status(api, batch.id, {"cancelled"})
        assert done.request_counts.failed == 4
        assert done.cancelled_at is not None
        errors = await download(api, done.error_file_id)
        assert {row["error"]["code"] for row in errors} == {"batch_cancelled"}
        assert sorted(row["custom_id"] for row in errors) == ["c0", "c1", "c2", "c3"]
        with pytest.raises(openai.NotFoundError):
            await api.batches.cancel("batch_does_not_exist")
        assert sum(engine.calls.values()) == 0


async def test_metrics_and_probes_are_open(service: BatchService) -> None:
    async with aiohttp.ClientSession() as s:
        base = f"http://127.0.0.1:{service.port}"
        async with s.get(base + "/metrics") as response:
            text = await response.text()
        async with s.get(base + "/readyz") as response:
            assert response.status == 200
    series = {
        sample.name
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("model") == MODEL and sample.labels.get("region") == "eu-west"
    }
    assert {
        "fleetwarden_niw_backlog_items",
        "fleetwarden_niw_oldest_age_seconds",
        "fleetwarden_niw_in_flight_items",
        "fleetwarden_niw_backlog_due_items",
        "fleetwarden_niw_tokens_total",
        "fleetwarden_niw_items_total",
    } <= series
