"""Etalon's fluidity-index: the fraction of per-token deadlines a streamed response met.

Why this metric: TTFT and TBT percentiles cannot tell an early stall (the user sees the stream
freeze) from a late one that tokens arriving ahead of schedule had already paid for. The
fluidity-index (Etalon, Algorithm 1) gives every token a deadline, carries slack forward and
charges a stall once per deadline it swallowed.

The rule, exactly as the paper's Algorithm 1 (and Etalon's reference implementation
`get_request_level_deadline_miss_rate`):

* Token 0 (the first token) has budget ``D = ttft_deadline``; every later token ``D = tbt_deadline``.
  Its gap ``t`` is measured from the request start (token 0) or from the previous token.
* ``slack`` starts at 0. A token is on time when ``t <= D + slack``: it meets one deadline and
  ``slack += D - t``, so time saved by early tokens absorbs later hiccups (the slack is unbounded,
  like the paper's).
* A late token is late by ``late = t - slack - D > 0``. It is charged
  ``misses = late // tbt_deadline + 1`` deadlines, all of them missed: its own, plus one for each
  whole TBT period the stall covered (a deadline falling exactly at the token's arrival counts as
  missed, as the floor-plus-one of the paper implies). Then ``slack = 0``: the schedule restarts
  from the late token's actual arrival, since decoding is autoregressive and cannot catch up.
* ``index = met / (met + missed)``; a request with no tokens has index 1.0 (nothing was late).

So a stall inflates the denominator: ``[0.237] + 4 * [0.043]`` with deadlines 0.1 s / 0.05 s is
late by 0.137 s, charged ``2 + 1 = 3`` misses, then 4 tokens meet theirs: 4/7.

Everything is computed in integer microseconds (inputs are converted with `round`), so a float
like ``0.15 // 0.05 == 2.0`` can never drop a miss and no deadline flips on representation error.
`fluidity_index` follows the paper's slack formulation; `FluidityTracker` tracks the absolute
next deadline instead (O(1) per token for a streaming proxy). The two are algebraically the same
schedule, which the tests check on random inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

US_PER_S = 1_000_000


def to_us(seconds: float) -> int:
    """Seconds to integer microseconds, rounding to nearest (the only float step in this module)."""
    return round(seconds * US_PER_S)


@dataclass(frozen=True)
class FluidityCounts:
    """Deadlines met and missed by one request; the index is derived, never stored."""

    met_deadlines: int = 0
    missed_deadlines: int = 0

    @property
    def total_deadlines(self) -> int:
        return self.met_deadlines + self.missed_deadlines

    @property
    def index(self) -> float:
        """Fraction of deadlines met; 1.0 for a request that has no deadline yet."""
        total = self.total_deadlines
        return 1.0 if total == 0 else self.met_deadlines / total


def _check_deadlines_us(ttft_deadline_us: int, tbt_deadline_us: int) -> None:
    if ttft_deadline_us < 0:
        raise ValueError(f"TTFT deadline must be >= 0 us, got {ttft_deadline_us}")
    if tbt_deadline_us <= 0:
        raise ValueError(f"TBT deadline must be > 0 us (it divides stalls), got {tbt_deadline_us}")


def fluidity_counts_us(
    ttft_deadline_us: int, tbt_deadline_us: int, token_gaps_us: Iterable[int]
) -> FluidityCounts:
    """Algorithm 1 of the paper, line for line, in integer microseconds.

    `token_gaps_us` is the first-token time (from request start), then the inter-token gaps.
    """
    _check_deadlines_us(ttft_deadline_us, tbt_deadline_us)
    met = missed = slack_us = 0
    for i, gap_us in enumerate(token_gaps_us):
        if gap_us < 0:
            raise ValueError(f"token gap {i} is negative: {gap_us} us")
        budget_us = ttft_deadline_us if i == 0 else tbt_deadline_us
        if gap_us <= budget_us + slack_us:
            slack_us += budget_us - gap_us
            met += 1
        else:
            missed += (gap_us - slack_us - budget_us) // tbt_deadline_us + 1
            slack_us = 0
    return FluidityCounts(met, missed)


def fluidity_index(
    ttft_deadline_s: float, tbt_deadline_s: float, token_times_s: Sequence[float]
) -> float:
    """Fluidity-index of one request, from its first-token time then inter-token gaps (seconds)."""
    counts = fluidity_counts_us(
        to_us(ttft_deadline_s), to_us(tbt_deadline_s), (to_us(t) for t in token_times_s)
    )
    return counts.index


class FluidityTracker:
    """The fluidity-index of one request, updated per streamed token in O(1) time and space.

    Instead of slack it keeps the absolute time of the next deadline: an on-time token moves it
    one TBT period later than where it was (that is the slack carried forward), a late token moves
    it to one TBT period after the token itself (the reset). Equal to `fluidity_index` on the same
    token times, to the microsecond.
    """

    __slots__ = ("_last_us", "_met", "_missed", "_next_deadline_us", "_tbt_deadline_us")

    def __init__(self, ttft_deadline_s: float, tbt_deadline_s: float, start_s: float) -> None:
        ttft_deadline_us, self._tbt_deadline_us = to_us(ttft_deadline_s), to_us(tbt_deadline_s)
        _check_deadlines_us(ttft_deadline_us, self._tbt_deadline_us)
        self._last_us = to_us(start_s)
        self._next_deadline_us = self._last_us + ttft_deadline_us
        self._met = 0
        self._missed = 0

    def on_token(self, now_s: float) -> int:
        """Account one token that arrived at `now_s`; returns how many deadlines it missed.

        Raises ValueError if time runs backwards: token times come from one monotonic clock.
        """
        now_us = to_us(now_s)
        if now_us < self._last_us:
            raise ValueError(f"token at {now_s} s precedes the previous token or the start")
        self._last_us = now_us
        if now_us <= self._next_deadline_us:
            self._met += 1
            self._next_deadline_us += self._tbt_deadline_us
            return 0
        misses = (now_us - self._next_deadline_us) // self._tbt_deadline_us + 1
        self._missed += misses
        self._next_deadline_us = now_us + self._tbt_deadline_us
        return misses

    def on_tokens(self, now_s: float, count: int) -> int:
        """Account `count` tokens that arrived together at `now_s` (one read of the engine's
        stream); the same result and state as `count` calls of `on_token(now_s)`, in O(1).

        Only the first can be late: whether it met its deadline or reset it, the next deadline is
        then after `now_s`, so the others each meet one and push it one TBT period further.
        """
        if count <= 0:
            return 0
        misses = self.on_token(now_s)
        self._met += count - 1
        self._next_deadline_us += (count - 1) * self._tbt_deadline_us
        return misses

    @property
    def counts(self) -> FluidityCounts:
        return FluidityCounts(self._met, self._missed)

    @property
    def index(self) -> float:
        """Fluidity-index so far: 1.0 before the first token."""
        return self.counts.index

    @property
    def next_deadline_s(self) -> float:
        """When the next token is due; a scheduler may use it as the request's urgency."""
        return self._next_deadline_us / US_PER_S
