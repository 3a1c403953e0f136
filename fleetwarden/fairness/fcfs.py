"""First come, first served: one queue for everybody, in the chosen ordering (FIFO by default).

The baseline every fairness policy is measured against, and, with EDF or DPA ordering, SageServe's
deadline-aware schedulers applied across all tenants.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetwarden.fairness.ordering import FifoQueue, RequestQueue
from fleetwarden.fairness.request import Request


class FirstComeFirstServed:
    """One global queue; no per-tenant accounting."""

    def __init__(self, queue_factory: Callable[[], RequestQueue] = FifoQueue) -> None:
        self._queue = queue_factory()

    def push(self, request: Request, now: float) -> None:
        self._queue.push(request)

    def peek(self, now: float) -> Request | None:
        return self._queue.head(now)

    def pop(self, now: float) -> Request | None:
        return self._queue.pop(now) if self._queue.head(now) is not None else None

    def charge(
        self, request: Request, *, input_tokens: int = 0, output_tokens: int = 0, now: float
    ) -> None:
        """FCFS keeps no accounts."""

    def complete(self, request: Request, now: float) -> None:
        """FCFS keeps no accounts."""

    def remove(self, request: Request) -> bool:
        return self._queue.remove(request)

    def __len__(self) -> int:
        return len(self._queue)
