"""Durable stores behind one protocol (`base.BatchStore`): SQLite (default) and Redis (HA)."""

from __future__ import annotations

from fleetwarden.batch.config import RedisStoreConfig, SqliteStoreConfig
from fleetwarden.batch.store.base import (
    BatchStore,
    InvalidTransitionError,
    NotFoundError,
    QuotaExceededError,
    StoreError,
)

__all__ = [
    "BatchStore",
    "InvalidTransitionError",
    "NotFoundError",
    "QuotaExceededError",
    "StoreError",
    "open_store",
]


def open_store(config: SqliteStoreConfig | RedisStoreConfig) -> BatchStore:
    """The store the config names; imports only the backend in use."""
    if isinstance(config, SqliteStoreConfig):
        from fleetwarden.batch.store.sqlite_store import SqliteStore

        return SqliteStore(config.path, config.synchronous, config.busy_timeout_ms)
    from fleetwarden.batch.store.redis_store import RedisStore

    return RedisStore(
        config.url,
        config.key_prefix,
        config.replicas_ack,
        config.ack_timeout_ms,
        config.socket_timeout_s,
    )
