"""What the committer does with a settlement the store refuses with anything but a StoreError.

A refused *result* becomes an `internal_error` line for its item (written once, instead of the
item re-running until its batch expires). A refused *retry* has no result: the engine failed
transiently, so the item must not fail for good. Its lease is given back and it is in its queue
again at once (`test_refused_retry.py` has the details: refunds, stale leases, cancellation).
Each test runs on both stores, with the store's `settle` wrapped to refuse chosen items.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence

import pytest

from fleetwarden.batch.clock import ManualClock
from fleetwarden.batch.dispatcher import Committer
from fleetwarden.batch.records import BatchStatus, ClaimedItem, ItemResult, Settlement
from fleetwarden.batch.results import response_line
from fleetwarden.batch.runner import StoreRunner
from fleetwarden.batch.store.base import BatchStore
from tests.batch.builders import QUEUE, started_batch

T0 = 1_800_000_000.0
LEASE_S = 600.0


class Refusals:
    """Wraps `store.settle` to raise a non-store error for any call holding a refused settlement
    (the settlement itself: the committer's error line for its item is taken)."""

    def __init__(self, store: BatchStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.settlements: list[Settlement] = []
        settle = store.settle

        def refusing(settlements: Sequence[Settlement], now: float) -> list[bool]:
            if any(s in self.settlements for s in settlements):
                raise ValueError("the store cannot take this settlement")
            return settle(settlements, now)

        monkeypatch.setattr(store, "settle", refusing)


@pytest.fixture
def refusals(store: BatchStore, monkeypatch: pytest.MonkeyPatch) -> Refusals:
    return Refusals(store, monkeypatch)


@pytest.fixture
def committer(store: BatchStore) -> Iterator[Committer]:
    """A committer on `store`'s own worker thread (the store itself is closed by its fixture)."""
    runner = StoreRunner(store)
    yield Committer(runner, ManualClock(T0 + 1), batch_size=256, metrics=None)
    runner.close()


def claim_all(store: BatchStore, now: float) -> dict[str, ClaimedItem]:
    items = store.claim(QUEUE, by_deadline=100, promoted=0, limit=100, lease_until=now + LEASE_S)
    return {item.custom_id: item for item in items}


def ok(item: ClaimedItem) -> Settlement:
    line = response_line(item.batch_id, item.idx, item.custom_id, 200, "r", {})
    return Settlement(item, ItemResult(True, line))


async def commit(committer: Committer, settlements: Sequence[Settlement]) -> None:
    """Commit `settlements` as one group (all queued before the committer runs)."""
    for settlement in settlements:
        committer.put(settlement)
    task = asyncio.create_task(committer.run())
    await committer.flush()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def files(store: BatchStore, batch_id: str) -> tuple[list[str], list[tuple[str, str | None]]]:
    """The output file's custom_ids and the error file's (custom_id, error code)."""
    done = store.get_batch(batch_id)
    assert done is not None
    output = (store.file_content(done.output_file_id or "") or b"").splitlines()
    errors = [
        json.loads(r) for r in (store.file_content(done.error_file_id or "") or b"").splitlines()
    ]
    return (
        [json.loads(r)["custom_id"] for r in output],
        [(e["custom_id"], (e["error"] or {}).get("code")) for e in errors],
    )


async def test_a_refused_retry_goes_back_to_its_queue_and_runs_again(
    store: BatchStore, committer: Committer, refusals: Refusals
) -> None:
    """An older committer recorded req-1 as `internal_error`: a transient engine failure (a retry
    settlement) became a final failure because the store refused to write the retry. The next
    one left req-1 leased until its lease ran out."""
    started = started_batch(store, 3, now=T0)
    items = claim_all(store, T0)
    retry_at = T0 + 10
    refused = Settlement(items["req-1"], retry_at=retry_at)
    refusals.settlements.append(refused)
    await commit(committer, [ok(items["req-0"]), refused,
                             Settlement(items["req-2"], retry_at=retry_at)])  # fmt: skip
    refusals.settlements.clear()
    batch = store.get_batch(started.id)
    assert batch is not None
    assert (batch.status, batch.completed, batch.failed) == (BatchStatus.IN_PROGRESS, 1, 0)
    assert store.backlog(T0 + 1, ())[QUEUE].in_flight == 1  # req-2, until its backoff is over

    again = claim_all(store, T0 + 1)  # req-1 is queued already, without waiting out its lease
    assert set(again) == {"req-1"}
    assert again["req-1"].attempts == items["req-1"].attempts + 1  # a failure: its attempt counts
    store.recover_leases(retry_at)  # req-2's backoff is over
    assert set(claim_all(store, retry_at)) == {"req-2"}

    await commit(committer, [ok(again["req-1"])])
    batch = store.get_batch(started.id)
    assert batch is not None
    assert (batch.completed, batch.failed) == (2, 0)  # req-2 is still out, no error line for req-1


async def test_a_refused_retry_in_a_group_costs_nothing_else(
    store: BatchStore, committer: Committer, refusals: Refusals
) -> None:
    """A refused retry next to a refused result: the result becomes an error line as before,
    the retry runs again and completes, every item appears exactly once."""
    started = started_batch(store, 4, now=T0)
    items = claim_all(store, T0)
    group = [ok(items["req-0"]), Settlement(items["req-1"], retry_at=T0 + 10),
             ok(items["req-2"]), ok(items["req-3"])]  # fmt: skip
    refusals.settlements.extend(group[1:3])
    await commit(committer, group)
    refusals.settlements.clear()
    batch = store.get_batch(started.id)
    assert batch is not None
    assert (batch.status, batch.completed, batch.failed) == (BatchStatus.IN_PROGRESS, 2, 1)

    store.recover_leases(T0 + LEASE_S)
    again = claim_all(store, T0 + LEASE_S)
    assert set(again) == {"req-1"}
    await commit(committer, [ok(again["req-1"])])
    batch = store.get_batch(started.id)
    assert batch is not None
    assert (batch.status, batch.completed, batch.failed) == (BatchStatus.FINALIZING, 3, 1)
    assert store.finalize_batches(T0 + LEASE_S + 1) == [started.id]
    output, errors = files(store, started.id)
    assert output == ["req-0", "req-1", "req-3"]
    assert errors == [("req-2", "internal_error")]


async def test_a_refused_result_is_still_recorded_as_an_internal_error(
    store: BatchStore, committer: Committer, refusals: Refusals
) -> None:
    """Final settlements keep their behaviour: the error line is written once, no re-run."""
    started = started_batch(store, 1, now=T0)
    items = claim_all(store, T0)
    refused = ok(items["req-0"])
    refusals.settlements.append(refused)
    await commit(committer, [refused])
    refusals.settlements.clear()
    batch = store.get_batch(started.id)
    assert batch is not None
    assert (batch.status, batch.completed, batch.failed) == (BatchStatus.FINALIZING, 0, 1)
    store.recover_leases(T0 + LEASE_S)
    assert claim_all(store, T0 + LEASE_S) == {}
    assert store.finalize_batches(T0 + LEASE_S + 1) == [started.id]
    assert files(store, started.id) == ([], [("req-0", "internal_error")])
