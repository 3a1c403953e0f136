"""Fixtures of the batch service tests: both stores, a real redis-server, the stub engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetwarden.batch.store.base import BatchStore
from tests.batch.stub_engine import StubEngine
from tests.support.redis_server import REDIS_SERVER, running_redis
from tests.support.redis_server import redis_server as redis_server  # re-exported fixture

STORE_KINDS = ("sqlite", "redis")


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BatchStore]:
    """Each store implementation, fresh per test (Redis: its own server)."""
    if request.param == "sqlite":
        from fleetwarden.batch.store.sqlite_store import SqliteStore

        sqlite = SqliteStore(tmp_path / "batch.sqlite3")
        yield sqlite
        sqlite.close()
        return
    if not Path(REDIS_SERVER).exists():
        pytest.skip("redis-server is not installed")
    from fleetwarden.batch.store.redis_store import RedisStore

    with running_redis(tmp_path / "redis") as server:
        red = RedisStore(server.url)
        yield red
        red.close()


@pytest.fixture(params=STORE_KINDS)
def store_config(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The `store` section of a service config, for each store (Redis: its own server)."""
    if request.param == "sqlite":
        yield {"kind": "sqlite", "path": str(tmp_path / "batch.sqlite3")}
        return
    if not Path(REDIS_SERVER).exists():
        pytest.skip("redis-server is not installed")
    with running_redis(tmp_path / "redis") as server:
        yield {"kind": "redis", "url": server.url}


@pytest.fixture
async def engine() -> AsyncIterator[StubEngine]:
    """The stub OpenAI engine, started on a free port for the test."""
    stub = await StubEngine().start()
    yield stub
    await stub.stop()
