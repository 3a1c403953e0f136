"""The injectable clock: every deadline, lease and promotion decision reads time through it.

Wall-clock seconds since the epoch (not monotonic time) because deadlines are persisted and must
mean the same thing after a restart, and the OpenAI API reports Unix timestamps.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of the current time in Unix seconds."""

    def now(self) -> float:
        """The current time in Unix seconds."""
        ...


class SystemClock:
    """The real clock, for production."""

    def now(self) -> float:
        """`time.time()`."""
        return time.time()


class ManualClock:
    """A clock that moves only when told to, so expiry and promotion tests are deterministic."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        """The time last set."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by `seconds`."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self._now += seconds
