"""Tokens per second over observed time only: the scheduler's throughput and its drain rate.

The scheduler keeps two of these (the engine's output throughput, and the queue's drain rate that
early rejection in `admission` divides the work ahead by) across reconfigurations, while the
admission check and its backlog indexes are rebuilt with every config; so the estimator lives
apart from both. Pure: time is passed in.
"""

from __future__ import annotations

import math


class ThroughputEstimate:
    """Tokens per second over the observed time: an exponentially weighted moving average.

    Each observation is a count of tokens since the previous one; the average forgets with the
    given half-life, so a slowdown shows within seconds. Observations at one instant are one
    sample. Between `pause()` and the next `resume(now)` time is not observed at all, and nor are
    tokens: a caller pauses while the rate it measures is not the one it wants (for early
    rejection, while the engine is not saturated). None until `min_span_s` of observed time has
    accumulated (no rejection is better than one on no evidence).
    """

    def __init__(
        self, half_life_s: float = 10.0, min_span_s: float = 5.0, *, paused: bool = False
    ) -> None:
        if not half_life_s > 0 or not min_span_s >= 0:
            raise ValueError(
                f"half_life_s must be > 0 and min_span_s >= 0, got {half_life_s}, {min_span_s}"
            )
        self._half_life_s = half_life_s
        self._min_span_s = min_span_s
        self._paused = paused
        self._first_s: float | None = None
        self._last_s: float | None = None
        self._rate: float | None = None
        self._observed_s = 0.0
        self._pending = 0
        """Tokens observed at the instant observation (re)started: they join the next sample."""
        self._last_weight = 0.0
        self._last_elapsed = 0.0
        """The sample ending at `_last_s`: tokens observed at that same instant join it."""

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        """Stop observing: tokens and time until the next `resume` are left out."""
        self._paused = True

    def resume(self, now: float) -> None:
        """Observe from `now` on (a no-op while observing already)."""
        if self._paused or self._last_s is None:
            self._paused = False
            self._start(now)

    def _start(self, now: float) -> None:
        if self._first_s is None:
            self._first_s = now
        self._last_s = now
        self._pending = 0
        self._last_elapsed = 0.0

    def observe(self, tokens: int, now: float) -> None:
        if self._paused:
            return
        last = self._last_s
        if last is None:
            self._start(now)
            return
        elapsed = now - last
        if elapsed < 0:
            return
        if elapsed == 0:
            if self._last_elapsed > 0 and self._rate is not None:
                self._rate += self._last_weight * tokens / self._last_elapsed
            else:
                self._pending += tokens
            return
        sample = (tokens + self._pending) / elapsed
        self._pending = 0
        if self._rate is None:
            weight = 1.0
            self._rate = sample
        else:
            weight = 1.0 - math.exp(-math.log(2) * elapsed / self._half_life_s)
            self._rate += weight * (sample - self._rate)
        self._last_weight, self._last_elapsed = weight, elapsed
        self._observed_s += elapsed
        self._last_s = now

    def rate(self, now: float) -> float | None:
        if (
            self._first_s is None
            or self._rate is None
            or self._observed_s < self._min_span_s
            or now - self._first_s < self._min_span_s
        ):
            return None
        return self._rate
