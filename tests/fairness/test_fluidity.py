"""Etalon's fluidity-index: the paper's vectors, and the streaming tracker equal to the batch form."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.fairness.fluidity import (
    FluidityCounts,
    FluidityTracker,
    fluidity_counts_us,
    fluidity_index,
)

TTFT_S = 0.1
TBT_S = 0.05

# (first-token time then gaps, required index, deadlines met, deadlines counted = met + missed).
GOLDEN = [
    ([0.083] + 9 * [0.041], 1.0, 10, 10),
    ([0.237] + 4 * [0.043], 4 / 7, 4, 7),  # TTFT 0.137 s late: 0.137 // 0.05 + 1 = 3 misses
    ([0.061, 0.047, 0.262, 0.044, 0.046], 0.5, 4, 8),  # 0.17 s late after 0.042 s slack: 4 misses
    ([0.021] + 10 * [0.012] + [0.31] + 3 * [0.049], 1.0, 15, 15),  # 0.459 s slack absorbs the stall
    ([0.052, 0.031, 0.029, 0.193, 0.047], 4 / 6, 4, 6),  # 0.055 s late: 2 misses
    ([0.512], 0.0, 0, 9),  # 0.412 s late: 9 misses
    ([0.09, 0.049, 0.049, 0.149, 0.049, 0.049], 5 / 7, 5, 7),  # 0.087 s late: 2 misses
    ([], 1.0, 0, 0),  # no deadline at all
]


def _tracked(ttft_s: float, tbt_s: float, start_s: float, gaps_s: list[float]) -> FluidityTracker:
    tracker = FluidityTracker(ttft_s, tbt_s, start_s)
    now_s = start_s
    for gap_s in gaps_s:
        now_s += gap_s
        tracker.on_token(now_s)
    return tracker


@pytest.mark.parametrize(("gaps_s", "expected", "met", "total"), GOLDEN, ids=list("abcdefgh"))
def test_golden_vectors(gaps_s: list[float], expected: float, met: int, total: int) -> None:
    assert fluidity_index(TTFT_S, TBT_S, gaps_s) == expected
    counts = fluidity_counts_us(100_000, 50_000, [round(g * 1e6) for g in gaps_s])
    assert counts == FluidityCounts(met, total - met)
    tracker = _tracked(TTFT_S, TBT_S, 12.5, gaps_s)
    assert tracker.counts == counts
    assert tracker.index == expected


def test_a_stall_counts_every_deadline_it_swallowed() -> None:
    # 0.137 s late with a 0.05 s TBT: its own deadline plus two whole periods.
    assert fluidity_counts_us(100_000, 50_000, [237_000]) == FluidityCounts(0, 3)


def test_float_floor_division_cannot_drop_a_miss() -> None:
    # In floats (0.25 - 0.1) // 0.05 == 2.0, though the stall is exactly 3 periods.
    assert (0.25 - 0.1) // 0.05 == 2.0
    assert fluidity_counts_us(100_000, 50_000, [250_000, 50_000]) == FluidityCounts(1, 4)
    assert fluidity_index(0.1, 0.05, [0.25, 0.05]) == 1 / 5


def test_token_exactly_on_its_deadline_meets_it() -> None:
    assert fluidity_index(0.1, 0.05, [0.1, 0.05, 0.05]) == 1.0
    assert fluidity_counts_us(100_000, 50_000, [100_001]) == FluidityCounts(0, 1)


def test_tracker_reports_misses_and_next_deadline() -> None:
    tracker = FluidityTracker(0.1, 0.05, start_s=10.0)
    assert tracker.index == 1.0
    assert tracker.next_deadline_s == pytest.approx(10.1)
    assert tracker.on_token(10.06) == 0  # 0.04 s slack
    assert tracker.next_deadline_s == pytest.approx(10.15)
    assert tracker.on_token(10.3) == 4  # 0.15 s late: 3 periods + its own
    assert tracker.next_deadline_s == pytest.approx(10.35)
    assert tracker.counts == FluidityCounts(1, 4)


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="TBT"):
        fluidity_index(0.1, 0.0, [0.1])
    with pytest.raises(ValueError, match="negative"):
        fluidity_index(0.1, 0.05, [0.1, -0.01])
    tracker = FluidityTracker(0.1, 0.05, start_s=1.0)
    with pytest.raises(ValueError, match="precedes"):
        tracker.on_token(0.5)


deadline_us = st.integers(min_value=1, max_value=2_000_000)
gaps_us = st.lists(st.integers(min_value=0, max_value=3_000_000), max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    ttft_us=st.integers(min_value=0, max_value=2_000_000),
    tbt_us=deadline_us,
    start_us=st.integers(min_value=0, max_value=10**11),
    gaps=gaps_us,
)
def test_tracker_equals_batch(ttft_us: int, tbt_us: int, start_us: int, gaps: list[int]) -> None:
    """The absolute-deadline tracker and the paper's slack loop agree on every input."""
    batch = fluidity_counts_us(ttft_us, tbt_us, gaps)
    tracker = FluidityTracker(ttft_us / 1e6, tbt_us / 1e6, start_us / 1e6)
    now_us = start_us
    for gap in gaps:
        now_us += gap
        tracker.on_token(now_us / 1e6)
    assert tracker.counts == batch
    assert tracker.index == batch.index
    assert fluidity_index(ttft_us / 1e6, tbt_us / 1e6, [g / 1e6 for g in gaps]) == batch.index


@settings(max_examples=150, deadline=None)
@given(ttft_us=st.integers(min_value=0, max_value=2_000_000), tbt_us=deadline_us, gaps=gaps_us)
def test_index_in_unit_interval(ttft_us: int, tbt_us: int, gaps: list[int]) -> None:
    counts = fluidity_counts_us(ttft_us, tbt_us, gaps)
    assert 0.0 <= counts.index <= 1.0
    # Every token accounts at least one deadline, met or missed.
    assert counts.total_deadlines >= len(gaps)


@settings(max_examples=150, deadline=None)
@given(
    ttft_us=st.integers(min_value=0, max_value=2_000_000),
    tbt_us=deadline_us,
    data=st.data(),
)
def test_early_tokens_always_fluid(ttft_us: int, tbt_us: int, data: st.DataObject) -> None:
    first = data.draw(st.integers(min_value=0, max_value=ttft_us))
    rest = data.draw(st.lists(st.integers(min_value=0, max_value=tbt_us), max_size=40))
    counts = fluidity_counts_us(ttft_us, tbt_us, [first, *rest])
    assert counts == FluidityCounts(1 + len(rest), 0)
    assert counts.index == 1.0


@settings(max_examples=150, deadline=None)
@given(
    ttft_us=st.integers(min_value=0, max_value=2_000_000),
    tbt_us=deadline_us,
    reads=st.lists(
        st.tuples(st.integers(min_value=0, max_value=3_000_000), st.integers(0, 6)), max_size=30
    ),
)
def test_tokens_of_one_read_count_as_that_many_single_tokens(
    ttft_us: int, tbt_us: int, reads: list[tuple[int, int]]
) -> None:
    """`on_tokens(now, n)` (the sidecar's per-read call) leaves the same counts, index and next
    deadline, and returns the same misses, as n calls of `on_token(now)`."""
    together = FluidityTracker(ttft_us / 1e6, tbt_us / 1e6, 1.0)
    one_by_one = FluidityTracker(ttft_us / 1e6, tbt_us / 1e6, 1.0)
    now_us = 1_000_000
    for gap, count in reads:
        now_us += gap
        missed = together.on_tokens(now_us / 1e6, count)
        assert missed == sum(one_by_one.on_token(now_us / 1e6) for _ in range(count))
        assert together.counts == one_by_one.counts
        assert together.next_deadline_s == one_by_one.next_deadline_s
