"""Runs the synchronous store on one worker thread, so the event loop never blocks on disk.

One thread, not a pool: SQLite has one writer anyway, its connection is used from one thread at
a time, and a single queue of transactions keeps their order equal to the order of the awaits.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from fleetwarden.batch.store.base import BatchStore

_P = ParamSpec("_P")
_T = TypeVar("_T")


class StoreRunner:
    """`await runner.call(store.method, ...)` runs the method on the store thread."""

    def __init__(self, store: BatchStore) -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-store")

    async def call(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Finish queued calls, then close the store."""
        self._pool.shutdown(wait=True)
        self.store.close()
