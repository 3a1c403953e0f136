"""`dispatch.single_replica` follows the store unless set: true for SQLite, false for Redis.

It defaulted to true whatever the store, and a starting replica then re-queues every lease in the
store. With Redis, whose point is several replicas, a replica restarting next to a live one took
back the items the live one was still running and both sent them (a crash review reproduced one
item at the engine twice at once). The chart set it by store already; a hand-written config did not.
"""

from __future__ import annotations

import pytest

from fleetwarden.batch.config import BatchServiceConfig


def config(store: str, single_replica: bool | None = None) -> BatchServiceConfig:
    body: dict[str, object] = {"store": {"kind": store}}
    if single_replica is not None:
        body["dispatch"] = {"single_replica": single_replica}
    return BatchServiceConfig.model_validate(body)


@pytest.mark.parametrize(("store", "expected"), [("sqlite", True), ("redis", False)])
def test_unset_follows_the_store(store: str, expected: bool) -> None:
    assert config(store).single_replica is expected


@pytest.mark.parametrize("store", ["sqlite", "redis"])
@pytest.mark.parametrize("given", [True, False])
def test_a_given_value_wins(store: str, given: bool) -> None:
    assert config(store, given).single_replica is given
