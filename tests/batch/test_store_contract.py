"""The store contract, run against both SQLite and a real redis-server.

Each test drives the store's transactions directly with explicit times, so ordering, leases,
retries, expiry, cancellation and finalisation are checked without a dispatcher or a clock.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleetwarden.batch.ids import new_batch_id
from fleetwarden.batch.records import (
    BatchRecord,
    BatchStatus,
    ClaimedItem,
    ItemResult,
    LineError,
    QueueKey,
    Settlement,
)
from fleetwarden.batch.results import response_line
from fleetwarden.batch.store.base import (
    BatchStore,
    InvalidTransitionError,
    NotFoundError,
    Promotion,
    PromotionError,
    QuotaExceededError,
)
from fleetwarden.scaling.niw_release import ReleaseRule
from tests.batch.builders import QUEUE, started_batch

T0 = 1_700_000_000.0
LEASE = 600.0
HOUR = 3600.0


def claim(store: BatchStore, n: int, now: float, *, queue: QueueKey = QUEUE) -> list[ClaimedItem]:
    return store.claim(queue, by_deadline=n, promoted=0, limit=n, lease_until=now + LEASE)


def claim_promoted(
    store: BatchStore, n: int, now: float, *, by_deadline: int = 0, rule: ReleaseRule | None = None
) -> list[str]:
    """What a busy region's signal takes (promoted items only, unless `by_deadline`), by
    custom_id, under `rule` (SageServe's default: 10 h for a 24 h window)."""
    items = store.claim(
        QUEUE,
        by_deadline=by_deadline,
        promoted=n,
        limit=n + by_deadline,
        lease_until=now + LEASE,
        promotion=Promotion.of(rule or ReleaseRule(), now),
    )
    return [i.custom_id for i in items]


def ok(item: ClaimedItem) -> Settlement:
    line = response_line(item.batch_id, item.idx, item.custom_id, 200, "r", {"usage": {}})
    return Settlement(item, ItemResult(True, line, 3, 5))


def lines(store: BatchStore, file_id: str | None) -> list[dict[str, object]]:
    if file_id is None:
        return []
    content = store.file_content(file_id)
    assert content is not None
    return [json.loads(line) for line in content.decode().splitlines()]


def test_a_batch_runs_to_completion_with_files_in_input_order(store: BatchStore) -> None:
    batch = started_batch(store, 5, now=T0)
    assert batch.status is BatchStatus.IN_PROGRESS
    items = claim(store, 10, T0 + 1)
    assert [i.custom_id for i in items] == [f"req-{i}" for i in range(5)]
    assert all(i.attempts == 1 and i.tenant == "team-a" for i in items)
    fail = Settlement(items[2], ItemResult(False, '{"custom_id":"req-2"}'))
    applied = store.settle([ok(items[4]), fail, ok(items[0]), ok(items[1]), ok(items[3])], T0 + 2)
    assert applied == [True] * 5
    mid = store.get_batch(batch.id)
    assert mid is not None
    assert mid.status is BatchStatus.FINALIZING
    assert (mid.completed, mid.failed, mid.input_tokens, mid.output_tokens) == (4, 1, 12, 20)
    assert store.finalize_batches(T0 + 3) == [batch.id]
    done = store.get_batch(batch.id)
    assert done is not None
    assert done.status is BatchStatus.COMPLETED
    assert done.completed_at == T0 + 3
    assert [r["custom_id"] for r in lines(store, done.output_file_id)] == [
        "req-0", "req-1", "req-3", "req-4",
    ]  # fmt: skip
    assert [r["custom_id"] for r in lines(store, done.error_file_id)] == ["req-2"]
    output = store.get_file(done.output_file_id or "")
    assert output is not None
    assert output.purpose == "batch_output"
    assert output.lines == 4
    assert store.backlog(T0 + 3, [3600.0]) == {}


def test_a_second_settle_of_the_same_item_is_refused(store: BatchStore) -> None:
    started_batch(store, 1, now=T0)
    (item,) = claim(store, 1, T0)
    assert store.settle([ok(item)], T0 + 1) == [True]
    assert store.settle([ok(item)], T0 + 2) == [False]


def test_a_stale_lease_cannot_commit_after_recovery(store: BatchStore) -> None:
    batch = started_batch(store, 1, now=T0)
    (first,) = claim(store, 1, T0)
    assert store.recover_leases(T0 + LEASE + 1) == 1  # the dispatch was lost
    (second,) = claim(store, 1, T0 + LEASE + 2)
    assert second.attempts == 2
    assert second.token != first.token
    assert store.settle([ok(first)], T0 + LEASE + 3) == [False]
    assert store.settle([ok(second)], T0 + LEASE + 3) == [True]
    done = store.get_batch(batch.id)
    assert done is not None
    assert (done.completed, done.failed) == (1, 0)


def test_recover_everything_requeues_live_leases_at_startup(store: BatchStore) -> None:
    started_batch(store, 3, now=T0)
    claim(store, 3, T0)
    assert store.recover_leases(T0, everything=False) == 0
    assert store.recover_leases(T0, everything=True) == 3
    assert len(claim(store, 5, T0)) == 3


def test_a_retry_keeps_the_item_leased_until_its_backoff_is_over(store: BatchStore) -> None:
    started_batch(store, 1, now=T0)
    (item,) = claim(store, 1, T0)
    assert store.settle([Settlement(item, retry_at=T0 + 30)], T0 + 1) == [True]
    assert claim(store, 1, T0 + 2) == []
    assert store.recover_leases(T0 + 29) == 0
    assert store.recover_leases(T0 + 30) == 1
    (again,) = claim(store, 1, T0 + 31)
    assert again.attempts == 2


def test_claims_follow_deadlines_and_promoted_items_go_first(store: BatchStore) -> None:
    old_long = started_batch(store, 2, now=T0, window_s=7 * 86400, prefix="old")
    new_short = started_batch(store, 2, now=T0 + 11 * 3600, window_s=3600, prefix="new")
    now = T0 + 11 * 3600 + 1
    by_deadline = store.claim(QUEUE, by_deadline=1, promoted=0, limit=1, lease_until=now + LEASE)
    assert [(i.batch_id, i.custom_id) for i in by_deadline] == [(new_short.id, "new-0")]
    mixed = store.claim(
        QUEUE,
        by_deadline=1,
        promoted=1,
        promotion=Promotion.created_by(now - 10 * 3600),
        limit=5,
        lease_until=now + LEASE,
    )
    assert [(i.batch_id, i.custom_id) for i in mixed] == [
        (old_long.id, "old-0"),
        (new_short.id, "new-1"),
    ]
    capped = store.claim(QUEUE, by_deadline=5, promoted=5, limit=0, lease_until=now + LEASE,
                         promotion=Promotion.created_by(now))  # fmt: skip
    assert capped == []


def test_promoted_items_are_claimed_at_their_promotion_time(store: BatchStore) -> None:
    """A 2 h batch is promoted at 50 min (10/24 of its window), before an older 24 h batch
    that is promoted at 10 h; before, the claim took promoted items by creation time alone
    (older than 10 h), so a busy region never took the 2 h batch before it expired."""
    started_batch(store, 2, now=T0 - 5 * HOUR, window_s=24 * HOUR, prefix="day")
    started_batch(store, 2, now=T0, window_s=2 * HOUR, prefix="short")
    at = T0 + 50 * 60
    assert claim_promoted(store, 5, at - 1) == []
    assert claim_promoted(store, 1, at) == ["short-0"]
    assert claim_promoted(store, 5, at + 1) == ["short-1"]
    assert claim_promoted(store, 5, T0 + 5 * HOUR - 1) == []
    assert claim_promoted(store, 5, T0 + 5 * HOUR) == ["day-0", "day-1"]


def test_promoted_items_go_oldest_first_then_the_rest_by_deadline(store: BatchStore) -> None:
    started_batch(store, 2, now=T0, window_s=24 * HOUR, prefix="day")  # promoted at +10 h
    started_batch(store, 2, now=T0 + 9 * HOUR, window_s=2 * HOUR, prefix="short")  # 9 h 50
    started_batch(store, 2, now=T0 + 9.5 * HOUR, window_s=HOUR, prefix="hour")  # 9 h 55
    started_batch(store, 2, now=T0 + 10 * HOUR - 40, window_s=120, prefix="young")  # +10 s
    now = T0 + 10 * HOUR
    assert claim_promoted(store, 4, now, by_deadline=1) == [
        "day-0", "day-1", "short-0", "short-1", "young-0",  # young-0: the earliest deadline
    ]  # fmt: skip
    assert claim_promoted(store, 5, now) == ["hour-0", "hour-1"]
    assert claim_promoted(store, 5, now + 9) == []
    assert claim_promoted(store, 5, now + 10) == ["young-1"]


def test_the_promotion_rule_is_the_callers(store: BatchStore) -> None:
    """Each target may have its own rule (the config's per-target `release`)."""
    started_batch(store, 1, now=T0, window_s=24 * HOUR, prefix="day")
    started_batch(store, 1, now=T0, window_s=2 * HOUR, prefix="short")
    hourly = ReleaseRule(promote_after_s=HOUR)  # 2 h window: 5 min
    assert claim_promoted(store, 5, T0 + 5 * 60 - 1, rule=hourly) == []
    assert claim_promoted(store, 5, T0 + 5 * 60, rule=hourly) == ["short-0"]
    assert claim_promoted(store, 5, T0 + HOUR - 1, rule=hourly) == []
    assert claim_promoted(store, 5, T0 + HOUR, rule=hourly) == ["day-0"]


def test_recovered_items_are_promoted_again_and_finished_batches_are_not(
    store: BatchStore,
) -> None:
    kept = started_batch(store, 2, now=T0, window_s=2 * HOUR, prefix="kept")
    cancelled = started_batch(store, 1, now=T0, window_s=2 * HOUR, prefix="cancelled")
    expired = started_batch(store, 1, now=T0, window_s=HOUR, prefix="expired")
    now = T0 + HOUR
    assert store.expire_batches(now) == [expired.id]
    store.cancel_batch(cancelled.id, now)
    first = store.claim(QUEUE, by_deadline=0, promoted=5, limit=5, lease_until=now + LEASE,
                        promotion=Promotion.of(ReleaseRule(), now))  # fmt: skip
    assert [(i.batch_id, i.custom_id) for i in first] == [(kept.id, "kept-0"), (kept.id, "kept-1")]
    assert store.recover_leases(now + LEASE) == 2
    assert claim_promoted(store, 5, now + LEASE) == ["kept-0", "kept-1"]
    assert store.settle([ok(i) for i in first], now + LEASE) == [False, False]  # stale leases


def test_a_claim_of_promoted_items_needs_a_promotion_cut(store: BatchStore) -> None:
    """The cut is a `Promotion`; the deprecated `promoted_before` alias
    (`Promotion.created_by(promoted_before)`) is gone, so a caller still passing it fails loudly
    instead of claiming under a cut it did not mean."""
    started_batch(store, 1, now=T0)
    with pytest.raises(PromotionError, match="needs a promotion"):
        store.claim(QUEUE, by_deadline=0, promoted=1, limit=1, lease_until=T0)
    legacy: dict[str, Any] = {"promoted_before": T0}
    with pytest.raises(TypeError, match="promoted_before"):
        store.claim(QUEUE, by_deadline=0, promoted=1, limit=1, lease_until=T0, **legacy)
    assert [i.custom_id for i in claim(store, 1, T0)] == ["req-0"]  # nothing was leased


def test_queues_are_separate(store: BatchStore) -> None:
    other = QueueKey("llama-3-8b", "us-east")
    started_batch(store, 2, now=T0, queue=other)
    assert claim(store, 5, T0) == []
    assert len(claim(store, 5, T0, queue=other)) == 2


def test_quota_counts_unfinished_items_across_batches(store: BatchStore) -> None:
    started_batch(store, 3, now=T0)
    batch = BatchRecord(new_batch_id(), "team-a", "/v1/chat/completions", "file-x", "24h",
                        T0, T0 + 86400, total=8)  # fmt: skip
    with pytest.raises(QuotaExceededError):
        store.create_batch(batch, max_open_items=10)
    other_tenant = BatchRecord(new_batch_id(), "team-b", "/v1/chat/completions", "file-x", "24h",
                               T0, T0 + 86400, total=8)  # fmt: skip
    store.create_batch(other_tenant, max_open_items=10)
    items = claim(store, 3, T0)
    store.settle([ok(i) for i in items], T0)
    store.create_batch(batch, max_open_items=10)  # the first batch's items are finished now


def test_cancel_settles_queued_items_and_waits_for_in_flight_ones(store: BatchStore) -> None:
    batch = started_batch(store, 4, now=T0)
    running = claim(store, 1, T0)
    cancelling = store.cancel_batch(batch.id, T0 + 1)
    assert cancelling.status is BatchStatus.CANCELLING
    assert (cancelling.failed, cancelling.cancelling_at) == (3, T0 + 1)
    assert claim(store, 5, T0 + 2) == []
    assert store.finalize_batches(T0 + 2) == []
    assert store.settle([ok(running[0])], T0 + 3) == [True]
    assert store.finalize_batches(T0 + 4) == [batch.id]
    done = store.get_batch(batch.id)
    assert done is not None
    assert done.status is BatchStatus.CANCELLED
    assert [r["custom_id"] for r in lines(store, done.output_file_id)] == ["req-0"]
    errors = lines(store, done.error_file_id)
    assert [r["custom_id"] for r in errors] == ["req-1", "req-2", "req-3"]
    assert {r["error"]["code"] for r in errors} == {"batch_cancelled"}  # type: ignore[index]
    assert store.cancel_batch(batch.id, T0 + 5).status is BatchStatus.CANCELLED


def test_an_in_flight_item_of_a_cancelled_batch_is_not_retried(store: BatchStore) -> None:
    batch = started_batch(store, 1, now=T0)
    (item,) = claim(store, 1, T0)
    store.cancel_batch(batch.id, T0 + 1)
    store.settle([Settlement(item, retry_at=T0 + 10)], T0 + 2)
    assert store.recover_leases(T0 + 11) == 1
    assert store.finalize_batches(T0 + 12) == [batch.id]
    done = store.get_batch(batch.id)
    assert done is not None
    assert (done.status, done.failed) == (BatchStatus.CANCELLED, 1)


def test_cancel_of_finished_or_unknown_batches(store: BatchStore) -> None:
    batch = started_batch(store, 1, now=T0)
    store.settle([ok(i) for i in claim(store, 1, T0)], T0)
    with pytest.raises(InvalidTransitionError):
        store.cancel_batch(batch.id, T0)
    with pytest.raises(NotFoundError):
        store.cancel_batch("batch_missing", T0)


def test_a_refused_cancel_names_the_status_clients_see(store: BatchStore) -> None:
    """Not the internal `pending_final`: a finalizing batch is not yet "completed", and one
    waiting to finalise as expired still reads `in_progress`."""
    finishing = started_batch(store, 1, now=T0)
    store.settle([ok(i) for i in claim(store, 1, T0)], T0 + 1)
    expiring = started_batch(store, 1, now=T0, window_s=60, prefix="exp")
    assert store.expire_batches(T0 + 60) == [expiring.id]
    for batch, shown, heading in (
        (finishing, BatchStatus.FINALIZING, BatchStatus.COMPLETED),
        (expiring, BatchStatus.IN_PROGRESS, BatchStatus.EXPIRED),
    ):
        seen = store.get_batch(batch.id)
        assert seen is not None
        assert seen.status is shown
        with pytest.raises(InvalidTransitionError) as refused:
            store.cancel_batch(batch.id, T0 + 61)
        assert refused.value.status is shown
        assert str(refused.value) == (
            f"batch {batch.id} is {shown.value} (it will be {heading.value}); cannot cancel"
        )


def test_an_engine_reply_with_a_lone_surrogate_is_stored_exactly(store: BatchStore) -> None:
    """JSON may escape half a UTF-16 pair (an engine cutting a token inside an emoji); the
    line must still encode for the store, and the client gets the reply back as sent."""
    batch = started_batch(store, 2, now=T0)
    bodies = [{"content": "cut \ud83d"}, {"content": "caf\u00e9"}]
    settlements = [
        Settlement(item, ItemResult(True, response_line(batch.id, item.idx, item.custom_id,
                                                        200, "r", body)))
        for item, body in zip(claim(store, 2, T0), bodies, strict=True)
    ]  # fmt: skip
    assert store.settle(settlements, T0 + 1) == [True, True]
    assert store.finalize_batches(T0 + 2) == [batch.id]
    done = store.get_batch(batch.id)
    assert done is not None
    assert [r["response"]["body"] for r in lines(store, done.output_file_id)] == bodies  # type: ignore[index]
    content = store.file_content(done.output_file_id or "")
    assert content is not None
    assert "café".encode() in content  # text without lone surrogates stays UTF-8


def test_expiry_settles_everything_unfinished_and_refuses_late_results(store: BatchStore) -> None:
    batch = started_batch(store, 3, now=T0, window_s=60)
    first, second = claim(store, 2, T0)
    store.settle([ok(first)], T0 + 1)
    assert store.expire_batches(T0 + 59) == []
    assert store.expire_batches(T0 + 60) == [batch.id]
    assert store.expire_batches(T0 + 61) == []
    assert store.settle([ok(second)], T0 + 62) == [False]  # too late
    assert store.finalize_batches(T0 + 63) == [batch.id]
    done = store.get_batch(batch.id)
    assert done is not None
    assert (done.status, done.completed, done.failed) == (BatchStatus.EXPIRED, 1, 2)
    assert done.expired_at == T0 + 60
    errors = lines(store, done.error_file_id)
    assert [(r["custom_id"], r["error"]["code"]) for r in errors] == [  # type: ignore[index]
        ("req-1", "batch_expired"),
        ("req-2", "batch_expired"),
    ]


def test_validation_failure_keeps_the_errors_and_the_error_file(store: BatchStore) -> None:
    batch = BatchRecord(new_batch_id(), "team-a", "/v1/chat/completions", "file-x", "24h",
                        T0, T0 + 86400, total=2)  # fmt: skip
    store.create_batch(batch, max_open_items=2)
    assert store.validating_batches() == [batch.id]
    errors = [LineError("invalid_json", "bad", 2)]
    assert store.fail_batch(batch.id, errors, None, b"", T0 + 1)
    assert not store.fail_batch(batch.id, errors, None, b"", T0 + 1)
    failed = store.get_batch(batch.id)
    assert failed is not None
    assert (failed.status, failed.errors, failed.failed_at) == (
        BatchStatus.FAILED,
        tuple(errors),
        T0 + 1,
    )
    assert store.validating_batches() == []
    store.create_batch(
        BatchRecord(new_batch_id(), "team-a", "/v1/chat/completions", "f", "24h", T0, T0 + 1, 2),
        max_open_items=2,
    )  # the failed batch's items no longer count


def test_listing_is_newest_first_with_a_cursor(store: BatchStore) -> None:
    ids = [started_batch(store, 1, now=T0 + i).id for i in range(5)]
    first = store.list_batches("team-a", None, 2)
    assert [b.id for b in first] == [ids[4], ids[3]]
    rest = store.list_batches("team-a", first[-1].id, 10)
    assert [b.id for b in rest] == [ids[2], ids[1], ids[0]]
    assert store.list_batches("team-b", None, 10) == []
    assert store.list_batches("team-a", "batch_unknown", 10) == []
    files = store.list_files("team-a", None, 3)
    assert len(files) == 3
    assert len(store.list_files("team-a", files[-1].id, 10)) == 2


def test_backlog_counts_queued_in_flight_age_and_deadlines(store: BatchStore) -> None:
    started_batch(store, 3, now=T0, window_s=3600)
    started_batch(store, 2, now=T0 + 100, window_s=86400, prefix="late")
    claim(store, 1, T0 + 200)
    snapshot = store.backlog(T0 + 200, [3600.0, 86400.0])
    backlog = snapshot[QUEUE]
    assert (backlog.queued, backlog.in_flight, backlog.oldest_created_at) == (4, 1, T0)
    assert backlog.due == ((3600.0, 2), (86400.0, 4))
