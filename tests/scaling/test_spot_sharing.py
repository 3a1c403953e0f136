"""A pool's spot bound is shared max-min fairly by the ModelDeployments that want spot on it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetwarden.scaling.spot import share_spot_capacity

wants = st.dictionaries(st.text("abcdef", min_size=1, max_size=3), st.integers(0, 40), max_size=8)


@given(st.integers(0, 60), wants)
def test_the_split_respects_the_bound_the_wants_and_max_min_fairness(
    capacity: int, wanted: dict[str, int]
) -> None:
    shares = share_spot_capacity(capacity, wanted)
    assert shares.keys() == wanted.keys()
    assert sum(shares.values()) == min(capacity, sum(wanted.values()))  # nothing idles needlessly
    for key, share in shares.items():
        assert 0 <= share <= wanted[key]
        if share < wanted[key]:  # short of its want: nobody else holds more than one extra
            assert all(other <= share + 1 for other in shares.values())
    assert share_spot_capacity(capacity, dict(reversed(list(wanted.items())))) == shares


@pytest.mark.parametrize(
    ("capacity", "wanted", "expected"),
    [
        (6, {"a": 4, "b": 4}, {"a": 3, "b": 3}),
        (6, {"a": 1, "b": 10}, {"a": 1, "b": 5}),  # what a leaves goes to b
        (5, {"a": 4, "b": 4, "c": 4}, {"a": 1, "b": 2, "c": 2}),  # remainders by key
        (8, {"a": 2, "b": 3}, {"a": 2, "b": 3}),  # room for all: everyone gets its want
        (0, {"a": 2}, {"a": 0}),
    ],
)
def test_examples(capacity: int, wanted: dict[str, int], expected: dict[str, int]) -> None:
    assert share_spot_capacity(capacity, wanted) == expected


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        share_spot_capacity(-1, {"a": 1})
