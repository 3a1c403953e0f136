"""SageServe's NIW release rule: 1 item below 0.60, 2 below 0.50, promotion after 10 hours."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.scaling.niw_release import DEFAULT_RELEASE_RULE, ReleaseRule, ReleaseRuleError


@pytest.mark.parametrize(
    ("utilisation", "count"),
    [(0.0, 2), (0.49, 2), (0.50, 1), (0.59, 1), (0.60, 0), (0.95, 0), (None, 0), (math.nan, 0)],
)
def test_release_counts(utilisation: float | None, count: int) -> None:
    assert DEFAULT_RELEASE_RULE.release_count(utilisation) == count


def test_promotion_after_ten_hours() -> None:
    assert not DEFAULT_RELEASE_RULE.promoted(10 * 3600.0 - 1)
    assert DEFAULT_RELEASE_RULE.promoted(10 * 3600.0)


@pytest.mark.parametrize(
    "kwargs",
    [{"one_below": 0.4, "two_below": 0.5}, {"one_below": 1.2}, {"promote_after_s": 0.0}],
)
def test_bad_rules_are_typed_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(ReleaseRuleError):
        ReleaseRule(**kwargs)


@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0))
@settings(max_examples=50, deadline=None)
def test_release_never_grows_with_utilisation(a: float, b: float) -> None:
    low, high = sorted((a, b))
    assert DEFAULT_RELEASE_RULE.release_count(low) >= DEFAULT_RELEASE_RULE.release_count(high)
