"""One bad line or engine reply costs only itself, never other batches or other results.

Maintenance and the committer are shared by every tenant: a batch whose line breaks validation,
a step that fails, or a result the store cannot take must not stall anyone else. Each test runs
on both stores (a real SQLite file, a real redis-server), with a manual clock and the maintenance
rounds and capacity signals driven by the test.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import fleetwarden.batch.maintenance as maintenance
from fleetwarden.batch.clock import ManualClock
from fleetwarden.batch.dispatcher import Committer
from fleetwarden.batch.records import BatchRecord, BatchStatus, ItemResult, Settlement
from fleetwarden.batch.results import response_line
from fleetwarden.batch.runner import StoreRunner
from fleetwarden.batch.service import BatchService, Overrides
from fleetwarden.batch.store.base import BatchStore
from fleetwarden.batch.validation import InputLimits, ValidInput, validate_input
from tests.batch.builders import MODEL, QUEUE, chat_line, jsonl, started_batch
from tests.batch.harness import create_batch, running_service, service_config
from tests.batch.stub_engine import StubEngine

T0 = 1_800_000_000.0
_HEAD = b'{"custom_id":"%s","method":"POST","url":"/v1/chat/completions","body":{"model":"%s",'
SURROGATE_LINE = (
    _HEAD % (b"cut", MODEL.encode())
    + b'"messages":[{"role":"user","content":"truncated emoji \\ud83d"}]}}'
)
"""Valid JSON syntax, but `\\ud83d` is half of a UTF-16 pair: no UTF-8 encoding exists."""
DEEP_LINE = _HEAD % (b"deep", MODEL.encode()) + b'"messages":' + b"[" * 100_000 + b"]" * 100_000
"""200 KB of nesting: Python's JSON parser raises RecursionError, not JSONDecodeError."""


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
async def service(
    store_config: dict[str, Any], engine: StubEngine, clock: ManualClock
) -> AsyncIterator[BatchService]:
    config = service_config(store_config, engine.base_url, spot_url=engine.base_url)
    async with running_service(config, Overrides(clock=clock), loops=False) as running:
        yield running


async def batch(service: BatchService, batch_id: str) -> BatchRecord:
    found = await service.runner.call(service.runner.store.get_batch, batch_id)
    assert found is not None
    return found


async def rows(service: BatchService, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    content = await service.runner.call(service.runner.store.file_content, file_id)
    assert content is not None
    return [json.loads(line) for line in content.decode().split("\n") if line]


async def run_queued_items(service: BatchService) -> None:
    """Signal every target until nothing more is released, commit, then one maintenance round
    (which finalises what finished)."""
    assert service.dispatcher is not None
    while [item for t in service.dispatcher.targets for item in await service.dispatcher.signal(t)]:
        await service.dispatcher.drain()
    await service.dispatcher.drain()
    await service.maintenance.run_once()


@pytest.mark.parametrize(
    ("line", "custom_id"), [(SURROGATE_LINE, "cut"), (DEEP_LINE, None)], ids=["surrogate", "deep"]
)
async def test_a_line_that_breaks_parsing_fails_its_batch_and_no_other(
    service: BatchService, line: bytes, custom_id: str | None
) -> None:
    early = await create_batch(service, jsonl([chat_line("early")]))
    await service.maintenance.run_once()  # started before the bad line arrives
    bad = await create_batch(service, jsonl([chat_line("fine")]) + line + b"\n")
    late = await create_batch(service, jsonl([chat_line("late")]))
    await service.maintenance.run_once()
    failed = await batch(service, bad)
    assert failed.status is BatchStatus.FAILED
    assert [(e.line, e.code) for e in failed.errors] == [(2, "invalid_json")]
    [error_row] = await rows(service, failed.error_file_id)
    assert (error_row["custom_id"], error_row["error"]["line"]) == (custom_id, 2)
    await run_queued_items(service)
    for batch_id, cid in ((early, "early"), (late, "late")):
        done = await batch(service, batch_id)
        assert (done.status, done.completed, done.failed) == (BatchStatus.COMPLETED, 1, 0)
        assert [r["custom_id"] for r in await rows(service, done.output_file_id)] == [cid]


async def test_an_unexpected_error_in_one_batch_fails_it_alone(
    service: BatchService, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug that hits one batch every round (here a validator that raises) fails that batch,
    logged, instead of aborting every round for every tenant."""

    def validator(content: bytes, *args: Any) -> object:
        if b"trigger-bug" in content:
            raise RuntimeError("a bug")
        return validate_input(content, *args)

    monkeypatch.setattr(maintenance, "validate_input", validator)
    bad = await create_batch(service, jsonl([chat_line("trigger-bug")]))
    good = await create_batch(service, jsonl([chat_line("good")]))
    with caplog.at_level(logging.ERROR, logger=maintenance.__name__):
        await service.maintenance.run_once()
    failed = await batch(service, bad)
    assert failed.status is BatchStatus.FAILED
    assert [(e.code, e.line) for e in failed.errors] == [("internal_error", None)]
    assert "RuntimeError" in failed.errors[0].message
    assert any(bad in r.getMessage() and r.exc_info for r in caplog.records)
    await run_queued_items(service)
    assert (await batch(service, good)).status is BatchStatus.COMPLETED


async def test_a_failing_step_does_not_stop_the_rest_of_the_round(
    service: BatchService, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = await create_batch(service, jsonl([chat_line("a"), chat_line("b")]), window="1h")
    await service.maintenance.run_once()
    assert (await batch(service, batch_id)).status is BatchStatus.IN_PROGRESS

    def broken(*_args: object) -> Any:
        raise RuntimeError("a bug")

    store = service.runner.store
    monkeypatch.setattr(store, "validating_batches", broken)  # the first step of a round
    monkeypatch.setattr(store, "recover_leases", broken)  # and the second
    clock.advance(3600)
    await service.maintenance.run_once()  # expiry and finalisation still run
    expired = await batch(service, batch_id)
    assert (expired.status, expired.failed) == (BatchStatus.EXPIRED, 2)


async def test_an_engine_reply_with_a_lone_surrogate_is_recorded_with_its_neighbours(
    service: BatchService, engine: StubEngine
) -> None:
    """Such a reply used to fail the commit of its whole group, every time: nothing recorded,
    every item re-run on lease expiry until the batch expired."""
    engine.contents["poison"] = "truncated emoji \ud83d"
    ids = ["a", "poison", "b", "c"]
    batch_id = await create_batch(service, jsonl([chat_line(c) for c in ids]))
    await service.maintenance.run_once()
    await run_queued_items(service)
    done = await batch(service, batch_id)
    assert (done.status, done.completed, done.failed) == (BatchStatus.COMPLETED, 4, 0)
    output = {r["custom_id"]: r for r in await rows(service, done.output_file_id)}
    assert list(output) == ids
    reply = output["poison"]["response"]["body"]["choices"][0]["message"]["content"]
    assert reply == "truncated emoji \ud83d"  # exactly what the engine sent
    assert engine.calls == dict.fromkeys(ids, 1)  # and nothing ran twice


@pytest.fixture
def committer(store: BatchStore) -> Iterator[Committer]:
    """A committer on `store`'s own worker thread (the store itself is closed by its fixture)."""
    runner = StoreRunner(store)
    yield Committer(runner, ManualClock(T0 + 1), batch_size=256, metrics=None)
    runner.close()


async def test_a_result_the_store_cannot_take_costs_only_its_own_item(
    store: BatchStore, committer: Committer
) -> None:
    """The committer splits a group the store refuses with anything but a StoreError: the
    healthy results are committed, the bad one becomes an error line instead of re-running."""
    started = started_batch(store, 4, now=T0)
    items = store.claim(QUEUE, by_deadline=4, promoted=0, limit=4, lease_until=T0 + 600)
    for item in items:
        line = response_line(started.id, item.idx, item.custom_id, 200, "r", {})
        if item.custom_id == "req-2":
            line = '{"custom_id":"req-2","body":"\ud83d"}'  # not from results: cannot encode
        committer.put(Settlement(item, ItemResult(True, line)))
    task = asyncio.create_task(committer.run())  # all four are queued: they form one group
    await committer.flush()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    settled = store.get_batch(started.id)
    assert settled is not None
    assert (settled.status, settled.completed, settled.failed) == (BatchStatus.FINALIZING, 3, 1)
    assert store.finalize_batches(T0 + 2) == [started.id]
    done = store.get_batch(started.id)
    assert done is not None
    output, errors = (store.file_content(f or "") or b"" for f in (done.output_file_id,
                                                                   done.error_file_id))  # fmt: skip
    assert [json.loads(r)["custom_id"] for r in output.splitlines()] == ["req-0", "req-1", "req-3"]
    [error] = [json.loads(r) for r in errors.splitlines()]
    assert (error["custom_id"], error["error"]["code"]) == ("req-2", "internal_error")


def test_the_surrogate_line_is_refused_only_for_its_lone_surrogate() -> None:
    """Guards the fixture above: completing the pair makes the same line valid."""
    limits = InputLimits(max_line_bytes=10**6, max_lines=10)
    healthy = SURROGATE_LINE.replace(b"\\ud83d", b"\\ud83d\\ude00")
    assert isinstance(validate_input(healthy + b"\n", "/v1/chat/completions", limits, {MODEL}),
                      ValidInput)  # fmt: skip
