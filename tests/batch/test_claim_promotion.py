"""Claims by promotion time: the store's cut agrees with the tier to the last bit, batches
created at the same instant, the Redis index of running batches (and databases written
before it), and the dispatcher passing each target's own rule.

The order and the basic cases are in the store contract (`test_store_contract`)."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from fleetwarden.api.enums import Tier
from fleetwarden.batch.clock import ManualClock
from fleetwarden.batch.policy import tier_for
from fleetwarden.batch.records import BatchRecord, FileRecord, ItemResult, QueueKey, Settlement
from fleetwarden.batch.service import BatchService, Overrides
from fleetwarden.batch.store.base import BatchStore, Promotion, PromotionError
from fleetwarden.scaling.niw_release import ReleaseRule
from tests.batch.builders import MODEL, QUEUE, chat_line, jsonl, new_items, started_batch
from tests.batch.harness import client, running_service, service_config
from tests.batch.stub_engine import StubEngine
from tests.support.redis_server import REDIS_SERVER, running_redis

T0 = 1_700_000_000.0
HOUR = 3600.0
LEASE = 600.0
RULE = ReleaseRule()


def claim_promoted(
    store: BatchStore, n: int, now: float, rule: ReleaseRule = RULE, queue: QueueKey = QUEUE
) -> list[str]:
    items = store.claim(queue, by_deadline=0, promoted=n, limit=n, lease_until=now + LEASE,
                        promotion=Promotion.of(rule, now))  # fmt: skip
    return [i.custom_id for i in items]


# -- the cut itself ---------------------------------------------------------------------------

finite_times = st.floats(min_value=0.0, max_value=4e9, allow_nan=False)
windows = st.floats(min_value=-10.0, max_value=30 * 86400.0, allow_nan=False)
promote_after = st.floats(min_value=1e-3, max_value=7 * 86400.0, allow_nan=False)


@given(finite_times, windows, st.floats(min_value=0.0, max_value=60 * 86400.0), promote_after)
def test_promotion_agrees_with_the_tier(
    created_at: float, window_s: float, age_s: float, after_s: float
) -> None:
    rule = ReleaseRule(promote_after_s=after_s)
    now, deadline = created_at + age_s, created_at + window_s
    expected = tier_for(rule, created_at, now, deadline) is Tier.IW_NORMAL
    assert Promotion.of(rule, now).promoted(created_at, deadline) is expected


def test_created_by_is_the_creation_time_cut() -> None:
    cut = Promotion.created_by(T0)
    assert cut.promoted(T0, T0 + 60)
    assert cut.promoted(T0 - 1, T0 + 7 * 86400)
    assert not cut.promoted(math.nextafter(T0, math.inf), T0 + 60)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"now": math.inf, "promote_after_s": 1.0}, "now must be finite"),
        ({"now": T0, "promote_after_s": -1.0}, "promote_after_s must be >= 0"),
        ({"now": T0, "promote_after_s": math.nan}, "promote_after_s must be >= 0"),
        ({"now": T0, "promote_after_s": 1.0, "reference_window_s": 0.0}, "reference_window_s"),
    ],
)
def test_a_bad_promotion_is_a_typed_error(fields: dict[str, float], message: str) -> None:
    with pytest.raises(PromotionError, match=message):
        Promotion(**fields)


@pytest.mark.parametrize("after_s", [10 * HOUR, 1234.5678])
def test_the_store_cut_is_the_tier_to_the_last_bit(store: BatchStore, after_s: float) -> None:
    """At the last instant before the tier turns `iw-n` the item is not claimed as promoted,
    at the first it is: the stores (SQL's host code, Redis' Lua) evaluate the same doubles."""
    rule = ReleaseRule(promote_after_s=after_s)
    cases = [(T0 + 0.1, 60.0), (T0 + 1 / 3, HOUR), (T0 + 0.7, 2 * HOUR),
             (T0 + 2 / 7, 86399.9), (T0 + 0.3, 86400.0), (T0 + 0.9, 7 * 86400.0)]  # fmt: skip
    for n, (created_at, window_s) in enumerate(cases):
        queue = QueueKey(MODEL, f"edge-{n}")
        started_batch(store, 1, now=created_at, window_s=window_s, queue=queue)
        deadline = created_at + window_s

        def promoted(now: float, c: float = created_at, d: float = deadline) -> bool:
            return tier_for(rule, c, now, d) is Tier.IW_NORMAL

        first = created_at + rule.promotion_age_s(window_s)
        while promoted(first):
            first = math.nextafter(first, -math.inf)
        while not promoted(first):
            first = math.nextafter(first, math.inf)
        before = math.nextafter(first, -math.inf)
        assert claim_promoted(store, 1, before, rule, queue) == [], (created_at, window_s)
        assert claim_promoted(store, 1, first, rule, queue) == ["req-0"], (created_at, window_s)


# -- batches created at the same instant ------------------------------------------------------


def batch_with_id(
    store: BatchStore, batch_id: str, n: int, now: float, window_s: float, prefix: str
) -> None:
    """`started_batch` with a chosen id (Redis orders one instant's items by id)."""
    content = jsonl([chat_line(f"{prefix}-{i}") for i in range(n)])
    upload = FileRecord(f"file-{prefix}", "team-a", "in.jsonl", "batch", len(content), now, n)
    store.put_file(upload, content)
    batch = BatchRecord(batch_id, "team-a", "/v1/chat/completions", upload.id, "24h", now,
                        now + window_s, total=n)  # fmt: skip
    store.create_batch(batch, max_open_items=10**9)
    assert store.start_batch(batch_id, QUEUE, new_items(n, prefix), now)


@pytest.mark.parametrize("short_id_first", [True, False])
def test_a_batch_created_at_the_same_instant_is_told_apart(
    store: BatchStore, short_id_first: bool
) -> None:
    low, high = "batch_" + "0" * 24, "batch_" + "f" * 24
    short_id, day_id = (low, high) if short_id_first else (high, low)
    batch_with_id(store, day_id, 3, T0, 24 * HOUR, "day")
    batch_with_id(store, short_id, 2, T0, 2 * HOUR, "short")
    now = T0 + 50 * 60
    assert claim_promoted(store, 1, now) == ["short-0"]
    assert claim_promoted(store, 5, now) == ["short-1"]
    assert claim_promoted(store, 5, T0 + 10 * HOUR) == ["day-0", "day-1", "day-2"]


# -- the Redis index of running batches -------------------------------------------------------


@pytest.fixture
def redis_url(tmp_path: Path) -> Any:
    if not Path(REDIS_SERVER).exists():
        pytest.skip("redis-server is not installed")
    with running_redis(tmp_path / "redis") as server:
        yield server.url


def _index(raw: redis.Redis, queue: QueueKey = QUEUE) -> list[str]:
    return [m.decode() for m in cast(list[bytes], raw.zrange(f"fwb:qb:{queue.encode()}", 0, -1))]


def test_a_redis_database_without_the_index_is_indexed_when_opened(redis_url: str) -> None:
    from fleetwarden.batch.store.redis_store import RedisStore

    raw = redis.Redis.from_url(redis_url)
    running = RedisStore(redis_url)
    day = started_batch(running, 1, now=T0 - 11 * HOUR, window_s=24 * HOUR, prefix="day")
    short = started_batch(running, 2, now=T0, window_s=2 * HOUR, prefix="short")
    raw.delete(f"fwb:qb:{QUEUE.encode()}")  # what a database of the previous version holds
    # A store opened before keeps the creation-time cut: every item older than 10 h.
    assert claim_promoted(running, 5, T0 + 50 * 60) == ["day-0"]
    reopened = RedisStore(redis_url)
    assert _index(raw) == [day.id, short.id]
    assert claim_promoted(reopened, 5, T0 + 50 * 60) == ["short-0", "short-1"]
    RedisStore(redis_url).close()  # idempotent
    assert _index(raw) == [day.id, short.id]
    for store in (running, reopened):
        store.close()


def test_redis_batches_leave_the_index_when_they_finish(redis_url: str) -> None:
    from fleetwarden.batch.store.redis_store import RedisStore

    raw = redis.Redis.from_url(redis_url)
    store = RedisStore(redis_url)
    done = started_batch(store, 1, now=T0, prefix="done")
    cancelled = started_batch(store, 1, now=T0, prefix="cancelled")
    expired = started_batch(store, 1, now=T0, window_s=60, prefix="expired")
    assert sorted(_index(raw)) == sorted([done.id, cancelled.id, expired.id])
    store.cancel_batch(cancelled.id, T0 + 1)
    assert store.expire_batches(T0 + 60) == [expired.id]
    assert _index(raw) == [done.id]
    (item,) = store.claim(QUEUE, by_deadline=1, promoted=0, limit=1, lease_until=T0 + LEASE)
    assert _index(raw) == [done.id]  # leased items can come back
    ok = Settlement(item, ItemResult(True, json.dumps({"custom_id": item.custom_id}), 1, 1))
    assert store.settle([ok], T0 + 61) == [True]
    assert _index(raw) == []
    store.close()


# -- the dispatcher passes each target's rule -------------------------------------------------


@pytest.fixture
async def hourly_service(
    store_config: dict[str, Any], engine: StubEngine
) -> AsyncIterator[tuple[BatchService, ManualClock]]:
    """One shared target whose own rule promotes after 1 h (the top-level rule: 10 h)."""
    target = {
        "model": MODEL,
        "region": "eu-west",
        "base_url": engine.base_url,
        "max_in_flight": 8,
        "utilisation": {"kind": "engine_metrics", "url": f"{engine.base_url}/metrics"},
        "release": {"promote_after_s": HOUR},
    }
    clock = ManualClock(T0)
    config = service_config(store_config, engine.base_url, targets=[target])
    async with running_service(config, Overrides(clock=clock), loops=False) as running:
        yield running, clock


async def test_a_busy_region_takes_a_batch_at_its_targets_promotion_time(
    hourly_service: tuple[BatchService, ManualClock], engine: StubEngine
) -> None:
    service, clock = hourly_service
    api = client(service)
    lines = jsonl([chat_line(i) for i in ("a", "b")])
    uploaded = await api.files.create(file=("in.jsonl", lines), purpose="batch")
    await api.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="2h",  # type: ignore[arg-type]
    )
    await service.maintenance.run_once()
    engine.kv_usage = 0.65  # above the release thresholds throughout
    assert service.dispatcher is not None
    [target] = service.dispatcher.targets
    clock.advance(5 * 60 - 1)  # 1 h x 2 h / 24 h = 5 min
    assert await service.dispatcher.signal(target) == []
    clock.advance(1)
    claimed = await service.dispatcher.signal(target)
    await service.dispatcher.drain()
    assert sorted(i.custom_id for i in claimed) == ["a", "b"]
    assert engine.tiers == {"a": ["iw-n"], "b": ["iw-n"]}
