"""Waiting `retry_after_s` passes the same check at epoch-scale times too.

The limiter counts whole microseconds, and returned ``(target_us - now_us) / 1e6``. A caller
retries at ``now + retry_after_s``, added in floats: at 1.7e9 s floats are about 0.24 us apart and
`now` itself may lie up to half a microsecond from the microsecond it rounds to, so that sum could
round 1 us short and the retry was refused again (review script `limits_boundary.py`: about 30 of
3,000 refusals). The times below are arbitrary floats up to 2e9 s, not whole microseconds.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fleetwarden.fairness.limits import RateLimiter, SlidingWindowCounter

EPOCH = st.floats(min_value=0.0, max_value=2e9, allow_nan=False, allow_infinity=False)
MANY = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))


def _recorded(times: list[float]) -> RateLimiter:
    limiter = RateLimiter(default={"rpm": len(times)})
    for t in times:
        limiter.record("a", None, 0, t)
    return limiter


@MANY
@given(t0=EPOCH, dt=st.floats(min_value=0.0, max_value=59.9999), more=st.integers(0, 2))
@example(t0=1424040476.009705, dt=1424040513.8433695 - 1424040476.009705, more=0)
@example(t0=1520387340.4276834, dt=1520387400.4275835 - 1520387340.4276834, more=0)
def test_waiting_retry_after_passes_and_two_microseconds_less_does_not(
    t0: float, dt: float, more: int
) -> None:
    """The review's case (rpm windows full of events at epoch-scale float times), replayed
    fresh for each probe: probing one limiter at a later time would move its clock. The wait is
    tight within 2 us (not 1: an arbitrary float `now` can sit half a microsecond off the grid)."""
    times = [t0 + i * 0.3 for i in range(more + 1)]
    now = times[-1] + dt
    decision = _recorded(times).check("a", None, 0, now)
    if decision.allowed:
        return
    retry = decision.retry_after_s
    assert 0.0 < retry < math.inf
    assert _recorded(times).check("a", None, 0, now + retry).allowed
    assert not _recorded(times).check("a", None, 0, (now + retry) - 2e-6).allowed


@MANY
@given(
    t0=EPOCH,
    gaps=st.lists(st.floats(min_value=0.0, max_value=20.0), min_size=1, max_size=6),
    amounts=st.lists(st.integers(1, 50), min_size=6, max_size=6),
    amount=st.integers(1, 60),
    limit=st.integers(1, 200),
    back=st.floats(min_value=0.0, max_value=1.0),
)
def test_window_waits_pass_for_token_amounts_and_late_stamps(
    t0: float,
    gaps: list[float],
    amounts: list[int],
    amount: int,
    limit: int,
    back: float,
) -> None:
    """TPM-like amounts, and a `now` earlier than the latest event (a late-stamped coroutine):
    the wait counts from the `now` given, so the caller's own retry time passes."""
    events, t = [], t0
    for gap, a in zip(gaps, amounts, strict=False):
        t += gap
        events.append((t, a))
    now = t - back

    def window() -> SlidingWindowCounter:
        w = SlidingWindowCounter()
        for at, a in events:
            w.add(a, at)
        return w

    retry = window().retry_after_s(amount, limit, now)
    if retry in (0.0, math.inf):
        return
    assert window().total(now + retry) + amount <= limit


def test_whole_microsecond_times_keep_whole_microsecond_waits() -> None:
    """Where the plain count works it is kept: the existing exactness tests still see waits that
    are whole microseconds."""
    window = SlidingWindowCounter()
    window.add(1, 10.000001)
    retry = window.retry_after_s(1, 1, 30.5)
    assert retry == 39.500001
    assert round(retry * 1e6) / 1e6 == retry


def test_a_late_stamp_waits_from_its_own_time() -> None:
    """The window takes an earlier `now` as its latest time, but the caller retries from its own:
    the wait was counted from the latest and fell short by the difference."""
    window = SlidingWindowCounter(window_s=60.0)
    window.add(1, 0.0)
    window.add(0, 10.0)  # the latest time seen
    retry = window.retry_after_s(1, 1, 5.0)
    assert retry == 55.0
    fresh = SlidingWindowCounter(window_s=60.0)
    fresh.add(1, 0.0)
    assert fresh.total(5.0 + retry) == 0
