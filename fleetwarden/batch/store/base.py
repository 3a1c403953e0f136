"""The durable store's interface, shared by the SQLite and Redis implementations.

Contract (what the crash tests check): every method is one atomic transaction. An upload or batch
is durable when the call returns. An item moves `queued -> leased -> done`; `claim` leases it
under a fresh token, `settle` commits its result only if that token still holds the lease, and a
lease that runs out sends the item back to `queued`. So a process killed at any instant loses no
accepted item (it is queued or leased, and leases run out or are recovered at startup) and writes
no result twice (the second settle of the same lease finds the item done and is refused).

The methods are synchronous: the service runs them on one worker thread, which is also what a
single SQLite writer wants, and the benchmark and tests can call them directly.

Errors::

    StoreError                    the store failed; nothing was changed
    +-- QuotaExceededError        the tenant has too many unfinished items
    +-- NotFoundError             no such batch or file (for this tenant)
    +-- InvalidTransitionError    e.g. cancelling a completed batch
    PromotionError (ValueError)   a claim's promotion cut is invalid (a caller's bug)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from fleetwarden.batch.records import (
    BatchRecord,
    BatchStatus,
    ClaimedItem,
    FileRecord,
    LineError,
    NewItem,
    QueueBacklog,
    QueueKey,
    Settlement,
)
from fleetwarden.scaling.niw_release import REFERENCE_WINDOW_S, ReleaseRule, promotion_age_s


class StoreError(Exception):
    """The store could not complete the operation; it changed nothing."""


class QuotaExceededError(StoreError):
    """Creating the batch would put the tenant over `max_queued_items`."""

    def __init__(self, tenant: str, open_items: int, requested: int, limit: int) -> None:
        super().__init__(
            f"tenant {tenant} has {open_items} unfinished items; {requested} more would exceed "
            f"the limit of {limit}"
        )


class NotFoundError(StoreError):
    """No such batch or file."""


class InvalidTransitionError(StoreError):
    """The batch's status does not allow the operation."""

    def __init__(
        self,
        batch_id: str,
        status: BatchStatus,
        action: str,
        pending: BatchStatus | None = None,
    ) -> None:
        """`status` is the one clients see (GET of the batch), never the internal
        `pending_final`; `pending`, the final status the batch is already headed for, only
        explains why a batch that still looks `in_progress` cannot change."""
        heading = f" (it will be {pending.value})" if pending is not None else ""
        super().__init__(f"batch {batch_id} is {status.value}{heading}; cannot {action}")
        self.status = status


class PromotionError(ValueError):
    """A claim's promotion cut is missing, given twice, or not finite and in range."""


@dataclass(frozen=True, slots=True)
class Promotion:
    """Which queued items count as promoted at `now`, for `BatchStore.claim`.

    An item created at `created_at` with deadline `deadline` is promoted when
    `now - created_at >= promotion age of its window (deadline - created_at)`, the age being
    `ReleaseRule.promotion_age_s`: `promote_after_s` scaled down for windows shorter than
    `reference_window_s` (`niw_release.promotion_age_s`, the one rule). SQLite calls `promoted`;
    the Redis claim script restates it in Lua in the same order, so an item is claimed as
    promoted exactly when `policy.tier_for` sends it at `iw-n`. The stores
    take the rule's numbers at claim time rather than storing a promotion time per batch: a
    queue's targets may each have their own rule, and the rule may change with the config.
    """

    now: float
    promote_after_s: float
    reference_window_s: float = REFERENCE_WINDOW_S

    def __post_init__(self) -> None:
        if not math.isfinite(self.now):
            raise PromotionError(f"now must be finite, got {self.now}")
        if not 0 <= self.promote_after_s < math.inf:
            raise PromotionError(
                f"promote_after_s must be >= 0 and finite, got {self.promote_after_s}"
            )
        if not 0 < self.reference_window_s < math.inf:
            raise PromotionError(
                f"reference_window_s must be > 0 and finite, got {self.reference_window_s}"
            )

    @classmethod
    def of(cls, rule: ReleaseRule, now: float) -> Promotion:
        """The items `rule` promotes at `now` (what the dispatcher claims with)."""
        return cls(now, rule.promote_after_s, rule.reference_window_s)

    @classmethod
    def created_by(cls, cut: float) -> Promotion:
        """Every item created at or before `cut`, whatever its window (an age of 0 after `cut`):
        the creation-time cut that claims took before promotion followed the window."""
        return cls(cut, 0.0)

    def age_s(self, window_s: float) -> float:
        """The promotion age of a `window_s` window: the rule's own `promotion_age_s`."""
        return promotion_age_s(window_s, self.promote_after_s, self.reference_window_s)

    def promoted(self, created_at: float, deadline: float) -> bool:
        """Whether an item created at `created_at`, due at `deadline`, is promoted at `now`."""
        return self.now - created_at >= self.age_s(deadline - created_at)


def resolve_promotion(promoted: int, promotion: Promotion | None) -> Promotion | None:
    """The promotion cut of a `claim` call; PromotionError when `promoted` items are asked for
    without one (the stores share this check)."""
    if promotion is None and promoted > 0:
        raise PromotionError(f"claiming {promoted} promoted items needs a promotion")
    return promotion


class BatchStore(Protocol):
    """What the service needs from durable storage."""

    def close(self) -> None:
        """Release connections."""
        ...

    # Files ------------------------------------------------------------------------------------

    def put_file(self, record: FileRecord, content: bytes) -> None:
        """Store an uploaded file and its content."""
        ...

    def get_file(self, file_id: str) -> FileRecord | None:
        """A file's metadata."""
        ...

    def file_content(self, file_id: str) -> bytes | None:
        """A file's bytes (uploads, and output and error files once written)."""
        ...

    def list_files(self, tenant: str, after: str | None, limit: int) -> list[FileRecord]:
        """A tenant's files, newest first, after the cursor `after` (a file id)."""
        ...

    def delete_file(self, file_id: str) -> None:
        """Delete a file and its content (the API checks that no running batch reads it)."""
        ...

    # Batches ----------------------------------------------------------------------------------

    def create_batch(self, batch: BatchRecord, max_open_items: int) -> BatchRecord:
        """Store a new `validating` batch if the tenant's unfinished items plus `batch.total`
        stay within `max_open_items` (checked in the same transaction); returns it with `seq`."""
        ...

    def get_batch(self, batch_id: str) -> BatchRecord | None: ...

    def list_batches(self, tenant: str, after: str | None, limit: int) -> list[BatchRecord]:
        """A tenant's batches, newest first, strictly after the cursor `after` (a batch id)."""
        ...

    def validating_batches(self) -> list[str]:
        """Batches waiting for validation (after a restart too)."""
        ...

    def start_batch(
        self, batch_id: str, queue: QueueKey, items: Sequence[NewItem], now: float
    ) -> bool:
        """`validating -> in_progress` and queue every item, atomically; False if the batch is no
        longer validating (cancelled or expired meanwhile)."""
        ...

    def fail_batch(
        self,
        batch_id: str,
        errors: Sequence[LineError],
        error_file: FileRecord | None,
        error_content: bytes,
        now: float,
    ) -> bool:
        """`validating -> failed` with its errors (and an error file naming every bad line)."""
        ...

    def cancel_batch(self, batch_id: str, now: float) -> BatchRecord:
        """Start cancelling: queued items are settled as cancelled now, in-flight ones finish.

        Idempotent for cancelling and cancelled batches; InvalidTransitionError for other final or
        finalizing batches.
        """
        ...

    # Dispatch ---------------------------------------------------------------------------------

    def claim(
        self,
        queue: QueueKey,
        *,
        by_deadline: int,
        promoted: int,
        limit: int,
        lease_until: float,
        promotion: Promotion | None = None,
    ) -> list[ClaimedItem]:
        """Lease queued items: first up to `promoted` items that `promotion` says are promoted
        (oldest first: by creation time, then batch, then line), then up to `by_deadline` by
        deadline; at most `limit` in all. `promotion` may be left out only when `promoted` is 0
        (else PromotionError, `resolve_promotion`).
        """
        ...

    def settle(self, settlements: Sequence[Settlement], now: float) -> list[bool]:
        """Commit results and retries in one transaction; each entry applies only if its item
        is still leased under its token (True), else it is a stale duplicate (False).

        A retry keeps the lease until `retry_at`, when recovery re-queues the item. The last
        result of a batch moves it to `finalizing`."""
        ...

    def requeue(self, item: ClaimedItem, refund: bool, now: float) -> bool:
        """Give back the lease of a dispatch whose retry `settle` did not take, with `refund`
        if that retry was an interrupted attempt (`Settlement.refund`).

        If `item` is still leased under its token, it goes back to its queue at once (settled
        as cancelled instead if its batch is being cancelled, as `recover_leases` does) and
        True is returned: the item is claimable again now rather than when its lease runs out.
        Otherwise the lease is someone else's or the item is finished: nothing changes and the
        answer is False, except that a refund still takes the attempt back from an unfinished
        item (recovery re-queued it when the lease ran out, counting the attempt as a crash's,
        and the dispatch has since learnt it was interrupted). Attempts never drop below 0.
        """
        ...

    def recover_leases(self, now: float, everything: bool = False) -> int:
        """Re-queue items whose lease ran out (all leased items if `everything`): a crashed or
        evicted dispatch, or a retry whose backoff is over. Items of a cancelling batch are
        settled as cancelled instead."""
        ...

    def expire_batches(self, now: float) -> list[str]:
        """Batches past `expires_at`: every unfinished item is settled as expired (a late
        result from an engine is then refused) and the batch will finalise as `expired`."""
        ...

    def finalize_batches(self, now: float) -> list[str]:
        """Write output and error files of batches with no open items and give them their final
        status with the file ids in one transaction; per-item state is then deleted."""
        ...

    def backlog(self, now: float, due_within_s: Sequence[float]) -> dict[QueueKey, QueueBacklog]:
        """Per queue: queued and in-flight counts, oldest queued item, deadline profile."""
        ...
