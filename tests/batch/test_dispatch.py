"""The dispatcher against the stub engine, with a manual clock: the release rule, promotion,
spot targets, retries, deadline order and expiry, each signal and maintenance round driven by
the test."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetwarden.batch.clock import ManualClock
from fleetwarden.batch.dispatcher import Target
from fleetwarden.batch.policy import TargetKind
from fleetwarden.batch.records import BatchStatus
from fleetwarden.batch.service import BatchService, Overrides
from tests.batch.builders import MODEL, chat_line, jsonl
from tests.batch.harness import client, running_service, service_config, sqlite_store
from tests.batch.stub_engine import StubEngine

T0 = 1_800_000_000.0


@pytest.fixture
async def spot_engine() -> AsyncIterator[StubEngine]:
    stub = await StubEngine().start()
    yield stub
    await stub.stop()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
async def service(
    tmp_path: Path, engine: StubEngine, spot_engine: StubEngine, clock: ManualClock
) -> AsyncIterator[BatchService]:
    config = service_config(sqlite_store(tmp_path), engine.base_url, spot_url=spot_engine.base_url)
    async with running_service(config, Overrides(clock=clock), loops=False) as running:
        yield running


def target(service: BatchService, kind: TargetKind = TargetKind.SHARED) -> Target:
    assert service.dispatcher is not None
    return next(t for t in service.dispatcher.targets if t.config.kind is kind)


async def submit(service: BatchService, ids: list[str], window: str = "24h") -> str:
    """Upload and create a batch through the API, then validate it (it starts queued)."""
    api = client(service)
    uploaded = await api.files.create(file=("in.jsonl", jsonl([chat_line(i) for i in ids])),
                                      purpose="batch")  # fmt: skip
    batch = await api.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window=window,  # type: ignore[arg-type]
    )
    await service.maintenance.run_once()
    return batch.id


async def signal(service: BatchService, kind: TargetKind = TargetKind.SHARED) -> list[str]:
    """One capacity signal, its items answered and committed; the released custom_ids."""
    assert service.dispatcher is not None
    items = await service.dispatcher.signal(target(service, kind))
    await service.dispatcher.drain()
    return [i.custom_id for i in items]


async def file_rows(service: BatchService, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    content = await service.runner.call(service.runner.store.file_content, file_id)
    assert content is not None
    return [json.loads(line) for line in content.decode().splitlines()]


@pytest.mark.parametrize(
    ("kv_usage", "released"),
    [(0.95, 0), (0.60, 0), (0.59, 1), (0.50, 1), (0.49, 2), (0.0, 2), (None, 0)],
)
async def test_each_signal_releases_what_the_release_rule_allows(
    service: BatchService, engine: StubEngine, kv_usage: float | None, released: int
) -> None:
    await submit(service, [f"r{i}" for i in range(6)])
    engine.kv_usage = kv_usage  # None: the engine's page lacks the gauge, so no evidence
    assert len(await signal(service)) == released
    assert len(await signal(service)) == released  # every signal, again
    assert sum(engine.calls.values()) == 2 * released
    assert target(service).last_utilisation == kv_usage


async def test_an_unreachable_engine_releases_nothing(
    service: BatchService, engine: StubEngine
) -> None:
    await submit(service, ["a", "b"])
    await engine.stop()
    assert await signal(service) == []


async def test_released_items_follow_deadlines_across_batches(
    service: BatchService, engine: StubEngine, clock: ManualClock
) -> None:
    await submit(service, ["day-0", "day-1"], window="24h")
    clock.advance(1)
    await submit(service, ["hour-0", "hour-1"], window="1h")
    engine.kv_usage = 0.55
    released = [await signal(service) for _ in range(4)]
    assert released == [["hour-0"], ["hour-1"], ["day-0"], ["day-1"]]


async def test_old_items_are_promoted_past_a_busy_region_as_interactive(
    service: BatchService, engine: StubEngine, clock: ManualClock
) -> None:
    engine.kv_usage = 0.95  # never below the release thresholds
    await submit(service, ["old-0", "old-1", "old-2"])
    clock.advance(10 * 3600 - 1)
    await submit(service, ["young-0"])
    assert await signal(service) == []
    clock.advance(1)
    assert sorted(await signal(service)) == ["old-0", "old-1", "old-2"]
    assert engine.tiers == {f"old-{i}": ["iw-n"] for i in range(3)}
    assert await signal(service) == []
    clock.advance(10 * 3600)
    assert await signal(service) == ["young-0"]


async def test_young_items_travel_as_niw(service: BatchService, engine: StubEngine) -> None:
    await submit(service, ["a"])
    await signal(service)
    assert engine.tiers == {"a": ["niw"]}


async def test_a_spot_target_fills_its_free_slots_regardless_of_utilisation(
    service: BatchService, engine: StubEngine, spot_engine: StubEngine
) -> None:
    engine.kv_usage = 0.99
    await submit(service, [f"s{i}" for i in range(6)])
    assert await signal(service, TargetKind.SHARED) == []
    assert len(await signal(service, TargetKind.SPOT)) == 4  # max_in_flight of the spot target
    assert len(await signal(service, TargetKind.SPOT)) == 2
    assert sum(spot_engine.calls.values()) == 6
    assert sum(engine.calls.values()) == 0


async def test_in_flight_items_bound_further_releases(
    service: BatchService, spot_engine: StubEngine
) -> None:
    assert service.dispatcher is not None
    spot_engine.latency_s = 0.2
    await submit(service, [f"s{i}" for i in range(6)])
    spot = target(service, TargetKind.SPOT)
    first = await service.dispatcher.signal(spot)
    second = await service.dispatcher.signal(spot)
    assert (len(first), len(second), spot.in_flight) == (4, 0, 4)
    await service.dispatcher.drain()
    assert spot.in_flight == 0
    assert len(await service.dispatcher.signal(spot)) == 2
    await service.dispatcher.drain()


async def test_engine_errors_retry_with_backoff_then_go_to_the_error_file(
    service: BatchService, engine: StubEngine, clock: ManualClock
) -> None:
    engine.fail_first["flaky"] = 1
    engine.fail_always["down"] = 503
    engine.fail_always["bad"] = 400
    batch_id = await submit(service, ["flaky", "down", "bad", "fine"])
    while await signal(service):
        pass
    assert engine.calls == {"flaky": 1, "down": 1, "bad": 1, "fine": 1}
    clock.advance(3.9)  # first backoff: 5 s +- 20 %
    await service.maintenance.run_once()
    assert await signal(service) == []
    for _ in range(2):  # second and third attempts (max_attempts = 3)
        clock.advance(12.1)
        await service.maintenance.run_once()
        while await signal(service):
            pass
    assert engine.calls == {"flaky": 2, "down": 3, "bad": 1, "fine": 1}
    await service.maintenance.run_once()
    batch = await service.runner.call(service.runner.store.get_batch, batch_id)
    assert batch is not None
    assert (batch.status, batch.completed, batch.failed) == (BatchStatus.COMPLETED, 2, 2)
    output = await file_rows(service, batch.output_file_id)
    assert [r["custom_id"] for r in output] == ["flaky", "fine"]
    errors = {r["custom_id"]: r for r in await file_rows(service, batch.error_file_id)}
    assert errors["down"]["response"]["status_code"] == 503
    assert errors["bad"]["response"]["status_code"] == 400
    assert errors["bad"]["response"]["body"]["error"]["message"] == "scripted failure"


async def test_an_item_that_takes_its_engine_down_every_time_ends_in_the_error_file(
    service: BatchService, engine: StubEngine, clock: ManualClock
) -> None:
    """Dropped connections are free retries only `max_interruptions` (3) times per item; then
    they count, and after `max_attempts` (3) more the item is an error, not a loop until its
    batch expires. Its neighbour completes at once."""
    engine.reset_always.add("poison")
    batch_id = await submit(service, ["poison", "fine"])
    for _ in range(12):
        while await signal(service):
            pass
        clock.advance(61.0)  # past any backoff (max_delay_s = 60)
        await service.maintenance.run_once()
    assert engine.calls == {"poison": 3 + 3, "fine": 1}
    batch = await service.runner.call(service.runner.store.get_batch, batch_id)
    assert batch is not None
    assert (batch.status, batch.completed, batch.failed) == (BatchStatus.COMPLETED, 1, 1)
    [error] = await file_rows(service, batch.error_file_id)
    assert error["custom_id"] == "poison"
    assert error["error"]["code"] == "engine_unavailable"
    assert "interrupted 6 times" in error["error"]["message"]


async def test_an_expired_batch_reports_its_unfinished_items(
    service: BatchService, engine: StubEngine, clock: ManualClock
) -> None:
    engine.kv_usage = 0.55
    batch_id = await submit(service, ["e0", "e1", "e2"], window="1h")
    assert await signal(service) == ["e0"]
    engine.kv_usage = 0.95
    clock.advance(3600)
    await service.maintenance.run_once()
    batch = await service.runner.call(service.runner.store.get_batch, batch_id)
    assert batch is not None
    assert (batch.status, batch.completed, batch.failed) == (BatchStatus.EXPIRED, 1, 2)
    assert batch.expired_at == T0 + 3600
    assert [r["custom_id"] for r in await file_rows(service, batch.output_file_id)] == ["e0"]
    errors = await file_rows(service, batch.error_file_id)
    assert [(r["custom_id"], r["error"]["code"]) for r in errors] == [
        ("e1", "batch_expired"),
        ("e2", "batch_expired"),
    ]
    engine.kv_usage = 0.0
    assert await signal(service) == []


async def test_metrics_follow_the_backlog_and_the_outcomes(
    service: BatchService, engine: StubEngine, clock: ManualClock
) -> None:
    engine.fail_always["bad"] = 400
    await submit(service, ["ok", "bad", "later"], window="2h")
    engine.kv_usage = 0.49
    await signal(service)
    clock.advance(600)
    await service.maintenance.run_once()
    values = {
        (s.name, s.labels.get("outcome") or s.labels.get("kind") or s.labels.get("within_seconds")): s.value
        for f in text_string_to_metric_families(service.metrics.render().decode())
        for s in f.samples
        if s.labels.get("model") == MODEL
    }  # fmt: skip
    assert values[("fleetwarden_niw_backlog_items", None)] == 1
    assert values[("fleetwarden_niw_oldest_age_seconds", None)] == 600
    assert values[("fleetwarden_niw_backlog_due_items", "3600")] == 0
    assert values[("fleetwarden_niw_backlog_due_items", "7200")] == 1
    assert values[("fleetwarden_niw_items_total", "completed")] == 1
    assert values[("fleetwarden_niw_items_total", "failed")] == 1
    assert values[("fleetwarden_niw_tokens_total", "output")] == 7


async def test_a_target_release_rule_overrides_the_service_rule(
    tmp_path: Path, engine: StubEngine, clock: ManualClock
) -> None:
    """A ModelDeployment's `niw.releaseAt` [0.8, 0.7] and 1 h promotion, written on its target,
    replace the top-level [0.6, 0.5] and 10 h for that target."""
    config = service_config(sqlite_store(tmp_path), engine.base_url)
    raw = config.model_dump(mode="json")
    raw["targets"][0]["release"] = {"one_below": 0.8, "two_below": 0.7, "promote_after_s": 3600}
    config = type(config).model_validate(raw)
    async with running_service(config, Overrides(clock=clock), loops=False) as service:
        await submit(service, [f"r{i}" for i in range(8)])
        engine.kv_usage = 0.75  # under the target's 0.8, over the service's 0.6
        assert len(await signal(service)) == 1
        engine.kv_usage = 0.65
        assert len(await signal(service)) == 2
        engine.kv_usage = 0.95
        assert await signal(service) == []
        clock.advance(3600)  # promoted after the target's hour, not the service's ten
        promoted = await signal(service)
        assert len(promoted) == 5
        assert {tier for tiers in engine.tiers.values() for tier in tiers} == {"niw", "iw-n"}
