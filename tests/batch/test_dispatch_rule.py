"""The release rule of a target is resolved once per signal: the rule that released an item (how
many, which were promoted) is the rule its tier is computed with, even if the target's rule is
replaced while the item is on its way to the engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleetwarden.batch.clock import ManualClock
from fleetwarden.batch.service import BatchService, Overrides
from fleetwarden.scaling.niw_release import ReleaseRule
from tests.batch.builders import chat_line, jsonl
from tests.batch.harness import client, running_service, service_config, sqlite_store
from tests.batch.stub_engine import StubEngine

T0 = 1_800_000_000.0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
async def service(
    tmp_path: Path, engine: StubEngine, clock: ManualClock
) -> AsyncIterator[BatchService]:
    config = service_config(sqlite_store(tmp_path), engine.base_url)
    async with running_service(config, Overrides(clock=clock), loops=False) as running:
        yield running


async def submit(service: BatchService, ids: list[str]) -> None:
    api = client(service)
    uploaded = await api.files.create(file=("in.jsonl", jsonl([chat_line(i) for i in ids])),
                                      purpose="batch")  # fmt: skip
    await api.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    await service.maintenance.run_once()


@pytest.mark.parametrize(
    ("claimed_with", "replaced_by", "tier"),
    [
        (None, ReleaseRule(promote_after_s=60.0), "niw"),  # service rule: 10 h, not yet promoted
        (ReleaseRule(promote_after_s=60.0), None, "iw-n"),  # own rule: promoted after a minute
    ],
)
async def test_an_item_travels_at_the_tier_of_the_rule_that_released_it(
    service: BatchService,
    engine: StubEngine,
    clock: ManualClock,
    claimed_with: ReleaseRule | None,
    replaced_by: ReleaseRule | None,
    tier: str,
) -> None:
    assert service.dispatcher is not None
    [target] = service.dispatcher.targets
    target.rule = claimed_with
    await submit(service, ["a"])
    clock.advance(3600)
    engine.kv_usage = 0.55  # under both rules' 0.60: one item per signal
    items = await service.dispatcher.signal(target)
    assert [i.custom_id for i in items] == ["a"]
    target.rule = replaced_by  # replaced after the claim, before the item's send has started
    await service.dispatcher.drain()
    assert engine.tiers == {"a": [tier]}
