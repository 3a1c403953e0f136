"""A failed WAIT after a Redis write is logged, not raised.

The write already happened on the primary. Raised, it became a StoreError, which the committer
takes for "nothing was written" and retries: a refunded attempt was then refunded twice (the
item's attempts came out 1 where 2 claims had been spent).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from fleetwarden.batch.store.redis_store import RedisStore
from tests.batch.builders import QUEUE, started_batch
from tests.support.redis_server import running_redis

T0, LEASE = 1_800_000_000.0, 600.0


def test_a_refund_survives_a_failed_wait(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with running_redis(tmp_path) as server:
        store = RedisStore(server.url)
        try:
            started_batch(store, 1, now=T0)
            store.claim(QUEUE, by_deadline=9, promoted=0, limit=9, lease_until=T0 + LEASE)
            store.recover_leases(T0 + LEASE)
            (second,) = store.claim(
                QUEUE, by_deadline=9, promoted=0, limit=9, lease_until=T0 + 2 * LEASE
            )
            assert second.attempts == 2

            def failing_wait(replicas: int, timeout_ms: int) -> int:
                raise redis.ConnectionError("connection reset during WAIT")

            store._replicas_ack = 1  # as with batch.redis.replicasAck: 1
            store._r.wait = failing_wait  # type: ignore[method-assign]
            assert store.requeue(second, True, T0 + LEASE + 1)  # no StoreError: it was written
            store._replicas_ack = 0
            (third,) = store.claim(
                QUEUE, by_deadline=9, promoted=0, limit=9, lease_until=T0 + 3 * LEASE
            )
            assert third.attempts == 2  # two claims spent, the interrupted one refunded once
            assert "waiting for redis replicas failed" in caplog.text
        finally:
            store.close()
