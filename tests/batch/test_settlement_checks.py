"""A Settlement no store could commit is refused where it is made, not in the committer.

Before, a retry without a finite `retry_at` reached the store: SQLite kept a lease no recovery
matches (the item stuck for good) and Redis refused it as a store error, which the committer
retries forever while every later commit waits behind it.
"""

from __future__ import annotations

import math

import pytest

from fleetwarden.batch.records import ClaimedItem, ItemResult, Settlement
from fleetwarden.batch.records import QueueKey as Q

ITEM = ClaimedItem("batch_x", 4, "cid", "/v1/chat/completions", {}, "t", 0.0, 100.0, 1, "tok",
                   Q("m", "r"))  # fmt: skip
RESULT = ItemResult(True, "{}")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one"),
        ({"result": RESULT, "retry_at": 5.0}, "exactly one"),
        ({"retry_at": math.nan}, "finite"),
        ({"retry_at": math.inf}, "finite"),
        ({"result": RESULT, "refund": True}, "only a retry"),
    ],
)
def test_uncommittable_settlements_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settlement(ITEM, **kwargs)  # type: ignore[arg-type]


def test_results_and_retries_are_accepted() -> None:
    assert Settlement(ITEM, RESULT).result is RESULT
    retry = Settlement(ITEM, retry_at=5.0, refund=True)
    assert (retry.retry_at, retry.refund) == (5.0, True)
