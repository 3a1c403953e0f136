"""Fixes of the NIW release path: the Prometheus source against a real Prometheus with the
config's default timeout, one release per fresh reading, and promotion relative to the
completion window."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fleetwarden.api.enums import Tier
from fleetwarden.batch.clock import ManualClock
from fleetwarden.batch.config import PrometheusSourceConfig, TargetConfig
from fleetwarden.batch.dispatcher import Target
from fleetwarden.batch.policy import (
    ReleasePlan,
    TargetKind,
    fresh_reading,
    release_plan,
    tier_for,
)
from fleetwarden.batch.service import BatchService, Overrides
from fleetwarden.batch.utilisation import FixedUtilisation, PrometheusSource, query_params
from fleetwarden.scaling.niw_release import ReleaseRule
from tests.batch.builders import MODEL, chat_line, jsonl
from tests.batch.harness import client, running_service, service_config, sqlite_store
from tests.batch.stub_engine import StubEngine
from tests.support.prometheus_server import PrometheusFactory
from tests.support.prometheus_server import prometheus_factory as prometheus_factory

T0 = 1_800_000_000.0
HOUR = 3600.0
RULE = ReleaseRule()
SHARED = f"{MODEL}/eu-west/shared"

# -- 1. the Prometheus source, against a real Prometheus --------------------------------------


@pytest.mark.parametrize("timeout_s", [None, 0.5, 2])
async def test_the_prometheus_source_reads_a_real_prometheus(
    prometheus_factory: PrometheusFactory, timeout_s: float | None
) -> None:
    """None: the target exactly as `fleetwarden batch-targets` renders it (no timeout given, so
    the config's float 5.0), which Prometheus refused as "5.0s" with HTTP 400."""
    server = prometheus_factory.start()
    raw: dict[str, Any] = {"kind": "prometheus", "url": server.url, "query": "vector(0.2)"}
    if timeout_s is not None:
        raw["timeout_s"] = timeout_s
    spec = PrometheusSourceConfig.model_validate(raw)
    if timeout_s is None:
        assert spec.timeout_s == 5.0
        assert isinstance(spec.timeout_s, float)
    source = PrometheusSource(spec.url, spec.query, "m", "r", spec.timeout_s)
    assert await source.utilisation() == pytest.approx(0.2)
    assert release_plan(TargetKind.SHARED, RULE, 0.2, 32).by_deadline == 2


def test_the_timeout_is_sent_as_bare_seconds() -> None:
    assert query_params(5.0) == {"timeout": "5.0"}
    assert query_params(2) == {"timeout": "2.0"}
    assert query_params(0.25) == {"timeout": "0.25"}


# -- 3. one release per fresh reading ----------------------------------------------------------


def test_a_reading_is_fresh_once_its_data_can_include_the_last_release() -> None:
    assert fresh_reading(T0, 30.0, None)  # nothing released yet
    assert not fresh_reading(T0 + 29.0, 30.0, T0)
    assert fresh_reading(T0 + 30.0, 30.0, T0)
    assert fresh_reading(T0, 0.0, T0)  # a live read, after the decision
    assert not fresh_reading(T0 - 1.0, 0.0, T0)


def test_a_stale_reading_releases_promoted_items_only() -> None:
    assert release_plan(TargetKind.SHARED, RULE, 0.45, 8, fresh=False) == ReleasePlan(0, 8, 8)
    assert release_plan(TargetKind.SHARED, RULE, 0.45, 8, fresh=True) == ReleasePlan(2, 8, 8)
    assert release_plan(TargetKind.SPOT, RULE, None, 4, fresh=False) == ReleasePlan(4, 0, 4)


def _prometheus_target(engine_url: str) -> dict[str, Any]:
    """A shared target as `fleetwarden batch-targets` renders it (its reading is replaced)."""
    return {
        "model": MODEL,
        "region": "eu-west",
        "base_url": engine_url,
        "max_in_flight": 8,
        "utilisation": {
            "kind": "prometheus",
            "url": "http://127.0.0.1:9",
            "query": "q",
            "max_age_s": 30.0,
        },
    }


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
async def prom_service(
    tmp_path: Path, engine: StubEngine, clock: ManualClock
) -> AsyncIterator[tuple[BatchService, FixedUtilisation]]:
    reading = FixedUtilisation(0.45)
    config = service_config(
        sqlite_store(tmp_path), engine.base_url, targets=[_prometheus_target(engine.base_url)]
    )
    overrides = Overrides(clock=clock, sources={SHARED: reading})
    async with running_service(config, overrides, loops=False) as running:
        yield running, reading


@pytest.fixture
async def engine_service(
    tmp_path: Path, engine: StubEngine, clock: ManualClock
) -> AsyncIterator[BatchService]:
    config = service_config(sqlite_store(tmp_path), engine.base_url)
    async with running_service(config, Overrides(clock=clock), loops=False) as running:
        yield running


def _target(service: BatchService) -> Target:
    assert service.dispatcher is not None
    [target] = service.dispatcher.targets
    return target


async def submit(service: BatchService, ids: list[str], window: str = "24h") -> None:
    api = client(service)
    uploaded = await api.files.create(file=("in.jsonl", jsonl([chat_line(i) for i in ids])),
                                      purpose="batch")  # fmt: skip
    await api.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window=window,  # type: ignore[arg-type]
    )
    await service.maintenance.run_once()


async def signal(service: BatchService) -> list[str]:
    """One capacity signal, its items answered and committed (slots free again)."""
    assert service.dispatcher is not None
    items = await service.dispatcher.signal(_target(service))
    await service.dispatcher.drain()
    return sorted(i.custom_id for i in items)


async def test_one_prometheus_reading_releases_once_per_scrape(
    prom_service: tuple[BatchService, FixedUtilisation], clock: ManualClock
) -> None:
    service, _ = prom_service
    assert TargetConfig.model_validate(_prometheus_target("http://x")).utilisation is not None
    await submit(service, [f"r{i:02d}" for i in range(20)])
    assert len(await signal(service)) == 2
    # The same 0.45 for the rest of the 30 s scrape: before, 2 more every second (8 in flight
    # within 4 s here, 32 within 15 s at the default max_in_flight).
    for _ in range(29):
        clock.advance(1)
        assert await signal(service) == []
    clock.advance(1)  # a reading that can include the released items
    assert len(await signal(service)) == 2


async def test_a_busy_reading_does_not_hold_the_next_fresh_one_back(
    prom_service: tuple[BatchService, FixedUtilisation], clock: ManualClock
) -> None:
    service, reading = prom_service
    await submit(service, [f"r{i:02d}" for i in range(20)])
    reading.value = 0.95
    assert await signal(service) == []  # nothing released: nothing to wait for
    reading.value = 0.45
    clock.advance(1)
    assert len(await signal(service)) == 2


async def test_promoted_items_go_on_a_stale_reading(
    prom_service: tuple[BatchService, FixedUtilisation], clock: ManualClock
) -> None:
    service, _ = prom_service
    await submit(service, [f"old-{i}" for i in range(4)])
    clock.advance(10 * HOUR - 1)
    await submit(service, [f"young-{i}" for i in range(4)])
    assert await signal(service) == ["old-0", "old-1"]  # the rule's 2, by deadline
    clock.advance(1)  # stale reading; the old batch is now promoted
    assert await signal(service) == ["old-2", "old-3"]  # before: plus young-0 and young-1


async def test_a_live_engine_reading_is_fresh_at_every_signal(
    engine_service: BatchService, engine: StubEngine
) -> None:
    await submit(engine_service, [f"r{i}" for i in range(6)])
    engine.kv_usage = 0.45
    assert len(await signal(engine_service)) == 2
    assert len(await signal(engine_service)) == 2


# -- 2. promotion relative to the completion window -------------------------------------------


@pytest.mark.parametrize(
    ("window_s", "age_s", "tier"),
    [
        (2 * HOUR, 50 * 60.0 - 1, Tier.NIW),
        (2 * HOUR, 50 * 60.0, Tier.IW_NORMAL),  # before: niw until it expired
        (24 * HOUR, 10 * HOUR - 1, Tier.NIW),
        (24 * HOUR, 10 * HOUR, Tier.IW_NORMAL),
        (7 * 24 * HOUR, 10 * HOUR, Tier.IW_NORMAL),
    ],
)
def test_the_tier_follows_the_window(window_s: float, age_s: float, tier: Tier) -> None:
    assert tier_for(RULE, created_at=T0, now=T0 + age_s, deadline=T0 + window_s) is tier


async def test_a_short_window_item_is_sent_at_interactive_priority_before_its_deadline(
    engine_service: BatchService, engine: StubEngine, clock: ManualClock
) -> None:
    await submit(engine_service, ["early", "late"], window="2h")
    engine.kv_usage = 0.55  # one item per signal
    clock.advance(50 * 60.0 - 1)
    assert await signal(engine_service) == ["early"]
    clock.advance(1)
    assert await signal(engine_service) == ["late"]
    assert engine.tiers == {"early": ["niw"], "late": ["iw-n"]}


async def test_a_short_window_batch_is_claimed_past_a_busy_region_before_its_deadline(
    engine_service: BatchService, engine: StubEngine, clock: ManualClock
) -> None:
    await submit(engine_service, ["a", "b"], window="2h")
    engine.kv_usage = 0.65  # above the release thresholds for the whole window
    clock.advance(50 * 60.0)
    assert await signal(engine_service) == ["a", "b"]
