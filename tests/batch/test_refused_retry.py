"""A retry settlement the store did not take gives its item back at once, attempt included.

A retry (an engine failure to try again, or an interrupted attempt whose attempt is refunded)
can fail to commit in two ways: the store raises something other than a StoreError for it (it
cannot take the record), or it answers that the lease is no longer the dispatch's (it ran out
and recovery re-queued the item). Before, the first left the item leased until its claim's
`lease_s` ran out (11 minutes by default) and the second dropped the refund: either way the next
claim counted an attempt the item never spent, and an item interrupted a few times more went to
the error file early. Each test runs on both real stores (SQLite and a real redis-server).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from fleetwarden.batch.clock import ManualClock
from fleetwarden.batch.dispatcher import Committer
from fleetwarden.batch.policy import TargetKind
from fleetwarden.batch.records import BatchStatus, ClaimedItem, Settlement
from fleetwarden.batch.service import Overrides
from fleetwarden.batch.store.base import BatchStore
from tests.batch.builders import QUEUE, chat_line, jsonl, started_batch
from tests.batch.harness import create_batch, running_service, service_config
from tests.batch.stub_engine import StubEngine
from tests.batch.test_commit_refusals import LEASE_S, T0, Refusals, claim_all, commit, files, ok
from tests.batch.test_commit_refusals import committer as committer  # re-exported fixtures
from tests.batch.test_commit_refusals import refusals as refusals

pytestmark = pytest.mark.timeout(60)


def interrupted(item: ClaimedItem) -> Settlement:
    """What `policy.settle` makes of an evicted spot pod: back soon, attempt refunded."""
    return Settlement(item, retry_at=T0 + 2, refund=True)


def in_flight(store: BatchStore, now: float) -> int:
    backlog = store.backlog(now, ()).get(QUEUE)
    return backlog.in_flight if backlog is not None else 0


async def refuse(
    committer: Committer, refusals: Refusals, settlements: Sequence[Settlement]
) -> None:
    """Commit `settlements` with the store refusing each of them."""
    refusals.settlements.extend(settlements)
    await commit(committer, settlements)
    refusals.settlements.clear()


async def test_a_refused_interruption_is_back_in_its_queue_at_once_with_its_attempt(
    store: BatchStore, committer: Committer, refusals: Refusals
) -> None:
    """Before: req-0 stayed leased until T0 + lease_s and was then claimed at attempt 2."""
    started = started_batch(store, 2, now=T0)
    items = claim_all(store, T0)
    await refuse(committer, refusals, [interrupted(items["req-0"])])
    assert in_flight(store, T0 + 1) == 1  # req-1 only
    again = claim_all(store, T0 + 1)  # no lease to wait out, not even the retry's short backoff
    assert set(again) == {"req-0"}
    assert again["req-0"].attempts == items["req-0"].attempts == 1  # the attempt is back

    await commit(committer, [ok(again["req-0"]), ok(items["req-1"])])
    assert store.finalize_batches(T0 + 3) == [started.id]
    assert files(store, started.id) == (["req-0", "req-1"], [])  # each exactly once


async def test_a_refused_retry_is_back_in_its_queue_at_once_and_its_attempt_counts(
    store: BatchStore, committer: Committer, refusals: Refusals
) -> None:
    """An engine failure (no refund) spends its attempt, so `max_attempts` still bounds it."""
    started_batch(store, 1, now=T0)
    (item,) = claim_all(store, T0).values()
    await refuse(committer, refusals, [Settlement(item, retry_at=T0 + 30)])
    (again,) = claim_all(store, T0 + 1).values()
    assert (again.custom_id, again.attempts) == ("req-0", 2)


async def test_an_interruption_whose_lease_ran_out_still_gets_its_attempt_back(
    store: BatchStore, committer: Committer
) -> None:
    """The dispatch outlived its lease (say the store was down while it waited to commit):
    recovery re-queued the item as if the dispatch had crashed, which counts an attempt; the
    late settlement is refused as stale but its refund is still owed."""
    started_batch(store, 1, now=T0)
    (item,) = claim_all(store, T0).values()
    assert store.recover_leases(T0 + LEASE_S) == 1
    await commit(committer, [interrupted(item)])
    (again,) = claim_all(store, T0 + LEASE_S).values()
    assert again.attempts == 1  # before: 2


async def test_a_late_interruption_leaves_the_next_lease_alone(
    store: BatchStore, committer: Committer, refusals: Refusals
) -> None:
    """Whether the store refuses the late retry or answers that it is stale, the item's new lease
    (another dispatch's) is neither re-queued nor settled: that dispatch's result is written,
    once, and the late refund is only taken off the item's count."""
    started = started_batch(store, 2, now=T0)
    first = claim_all(store, T0)
    assert store.recover_leases(T0 + LEASE_S) == 2
    second = claim_all(store, T0 + LEASE_S)
    assert [second[c].attempts for c in ("req-0", "req-1")] == [2, 2]
    await refuse(committer, refusals, [interrupted(first["req-0"])])
    await commit(committer, [interrupted(first["req-1"])])
    assert in_flight(store, T0 + LEASE_S) == 2  # both still the second dispatch's
    assert claim_all(store, T0 + LEASE_S) == {}

    await commit(committer, [ok(second["req-0"]), interrupted(second["req-1"])])
    store.recover_leases(T0 + LEASE_S + 2)
    (third,) = claim_all(store, T0 + LEASE_S + 2).values()
    assert (third.custom_id, third.attempts) == ("req-1", 1)  # both interruptions refunded
    await commit(committer, [ok(third)])
    assert store.finalize_batches(T0 + LEASE_S + 3) == [started.id]
    assert files(store, started.id) == (["req-0", "req-1"], [])


async def test_a_refused_retry_of_a_finished_item_changes_nothing(
    store: BatchStore, committer: Committer, refusals: Refusals
) -> None:
    """The batch expired meanwhile: its item is settled as expired and stays so."""
    started = started_batch(store, 1, now=T0, window_s=60.0)
    (item,) = claim_all(store, T0).values()
    assert store.expire_batches(T0 + 60) == [started.id]
    await refuse(committer, refusals, [interrupted(item)])
    await commit(committer, [interrupted(item)])  # and as a stale settlement
    assert claim_all(store, T0 + 61) == {}
    assert store.finalize_batches(T0 + 61) == [started.id]
    done = store.get_batch(started.id)
    assert done is not None
    assert (done.status, done.completed, done.failed) == (BatchStatus.EXPIRED, 0, 1)


async def test_a_refused_retry_of_a_cancelled_batch_settles_it_as_cancelled_at_once(
    store: BatchStore, committer: Committer, refusals: Refusals
) -> None:
    """As lease recovery does with an in-flight item of a cancelling batch, without the wait."""
    started = started_batch(store, 1, now=T0)
    (item,) = claim_all(store, T0).values()
    store.cancel_batch(started.id, T0 + 1)
    await refuse(committer, refusals, [interrupted(item)])
    assert store.finalize_batches(T0 + 2) == [started.id]
    done = store.get_batch(started.id)
    assert done is not None
    assert (done.status, done.completed, done.failed) == (BatchStatus.CANCELLED, 0, 1)


async def test_if_the_store_refuses_the_requeue_too_the_lease_still_runs_out(
    store: BatchStore,
    committer: Committer,
    refusals: Refusals,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last resort is the old one: the item waits out its lease, the committer lives on."""

    def broken(item: ClaimedItem, refund: bool, now: float) -> bool:
        raise ValueError("the store cannot take this either")

    monkeypatch.setattr(store, "requeue", broken, raising=False)
    started = started_batch(store, 2, now=T0)
    items = claim_all(store, T0)
    await refuse(committer, refusals, [interrupted(items["req-0"])])
    await commit(committer, [ok(items["req-1"])])  # the committer still works
    assert claim_all(store, T0 + 1) == {}
    store.recover_leases(T0 + LEASE_S)
    (again,) = claim_all(store, T0 + LEASE_S).values()
    await commit(committer, [ok(again)])
    assert store.finalize_batches(T0 + LEASE_S + 1) == [started.id]
    assert files(store, started.id) == (["req-0", "req-1"], [])


@pytest.fixture
async def spot() -> AsyncIterator[StubEngine]:
    stub = await StubEngine().start()
    yield stub
    await stub.stop()


async def test_an_evicted_item_whose_retry_is_refused_runs_again_on_the_next_signal(
    store_config: dict[str, Any],
    engine: StubEngine,
    spot: StubEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the service: a spot engine drops the item mid-request, the store refuses the
    retry, and the very next signal (no time passes, no maintenance runs) sends it again; its
    attempt was refunded, so a later 503 is still retried within `max_attempts=2`. Before, the
    item sat leased for `lease_s` and signals released nothing."""
    clock = ManualClock(T0)
    config = service_config(
        store_config, engine.base_url, spot_url=spot.base_url, retry={"max_attempts": 2}
    )
    async with running_service(config, Overrides(clock=clock), loops=False) as service:
        assert service.dispatcher is not None
        target = next(t for t in service.dispatcher.targets if t.config.kind is TargetKind.SPOT)
        store = service.runner.store
        settle = store.settle
        refused: list[Settlement] = []

        def refusing(settlements: Sequence[Settlement], now: float) -> list[bool]:
            if not refused and any(s.result is None for s in settlements):
                refused.extend(settlements)
                raise ValueError("the store cannot take this settlement")
            return settle(settlements, now)

        monkeypatch.setattr(store, "settle", refusing)
        batch_id = await create_batch(service, jsonl([chat_line("x")]))
        await service.maintenance.run_once()

        async def signal() -> list[str]:
            assert service.dispatcher is not None
            items = await service.dispatcher.signal(target)
            await service.dispatcher.drain()
            return [i.custom_id for i in items]

        spot.reset_always.add("x")
        assert await signal() == ["x"]
        assert [s.refund for s in refused] == [True]
        spot.reset_always.clear()
        spot.fail_first["x"] = 1
        assert await signal() == ["x"]  # at once: a plain 503 this time, retried
        clock.advance(60)
        await service.maintenance.run_once()
        assert await signal() == ["x"]
        await service.maintenance.run_once()
        done = await service.runner.call(store.get_batch, batch_id)
    assert done is not None
    assert (done.status, done.completed, done.failed) == (BatchStatus.COMPLETED, 1, 0)
    assert spot.calls["x"] == 3
