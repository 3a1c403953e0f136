"""The release rule's fixes: readings that are no readings release nothing, and promotion is
relative to the completion window, in the rule itself and in the simulator that shares it."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.scaling.niw_release import DEFAULT_RELEASE_RULE, ReleaseRule, ReleaseRuleError
from fleetwarden.sim.cluster import SimOptions
from fleetwarden.sim.fluid import simulate_fluid
from fleetwarden.sim.fluid_rates import Lengths, StepRates
from fleetwarden.sim.instance import Job
from fleetwarden.sim.niw_queue import NiwQueue
from fleetwarden.sim.profiles import VTC_A10G
from tests.sim.fleet_fixtures import model_yaml, pool_yaml, write_fleet

HOUR = 3600.0
DAY = 24 * HOUR


@pytest.mark.parametrize("utilisation", [-math.inf, -0.2, -1e-9, math.inf, math.nan, None])
def test_no_usable_reading_releases_nothing(utilisation: float | None) -> None:
    # -inf and negative readings used to release the maximum (2).
    assert DEFAULT_RELEASE_RULE.release_count(utilisation) == 0


def test_zero_and_values_above_one_are_readings() -> None:
    assert DEFAULT_RELEASE_RULE.release_count(0.0) == 2
    assert DEFAULT_RELEASE_RULE.release_count(1.5) == 0


@pytest.mark.parametrize(
    ("window_s", "age_s"),
    [
        (60.0, 25.0),  # the API's shortest window
        (HOUR, 25 * 60.0),
        (2 * HOUR, 50 * 60.0),
        (12 * HOUR, 5 * HOUR),
        (DAY, 10 * HOUR),  # SageServe's default: unchanged
        (7 * DAY, 10 * HOUR),  # never later than today
        (math.inf, 10 * HOUR),  # no deadline: the age bound
        (math.nan, 10 * HOUR),
    ],
)
def test_promotion_age_is_a_share_of_a_short_window(window_s: float, age_s: float) -> None:
    rule = DEFAULT_RELEASE_RULE
    assert rule.promotion_age_s(window_s) == pytest.approx(age_s)
    assert rule.promoted(age_s + 1e-6, window_s)
    assert not rule.promoted(age_s * (1 - 1e-9) - 1e-6, window_s)


def test_a_two_hour_window_is_promoted_before_its_deadline() -> None:
    # Before: promoted only at 10 h of age, 8 h after the batch had expired.
    assert not DEFAULT_RELEASE_RULE.promoted(50 * 60.0 - 1, 2 * HOUR)
    assert DEFAULT_RELEASE_RULE.promoted(50 * 60.0, 2 * HOUR)


def test_the_reference_window_scales_a_custom_promotion_age() -> None:
    rule = ReleaseRule(promote_after_s=HOUR, reference_window_s=DAY)
    assert rule.promotion_age_s(DAY) == HOUR
    assert rule.promotion_age_s(2 * HOUR) == pytest.approx(300.0)
    with pytest.raises(ReleaseRuleError):
        ReleaseRule(reference_window_s=0.0)
    with pytest.raises(ReleaseRuleError):
        ReleaseRule(reference_window_s=math.inf)


@given(st.floats(60.0, 7 * DAY), st.floats(60.0, 7 * DAY))
@settings(max_examples=100, deadline=None)
def test_promotion_never_comes_later_than_the_age_bound_and_grows_with_the_window(
    a: float, b: float
) -> None:
    rule = DEFAULT_RELEASE_RULE
    short, long = sorted((a, b))
    assert rule.promotion_age_s(short) <= rule.promotion_age_s(long) <= rule.promote_after_s
    assert rule.promotion_age_s(short) < short  # always some time left at interactive priority


def _job(arrival_s: float, deadline_s: float | None, seq: int) -> Job:
    """What `NiwQueue` reads of a job: arrival, deadline and the request's sequence number."""
    request = SimpleNamespace(seq=seq)
    job = SimpleNamespace(arrival_s=arrival_s, niw_deadline_s=deadline_s, request=request)
    return cast(Job, job)


def test_the_simulated_queue_promotes_a_short_window_on_a_busy_region() -> None:
    queue = NiwQueue(DEFAULT_RELEASE_RULE)
    queue.push(_job(0.0, 2 * HOUR, 1))
    assert queue.release(50 * 60.0 - 1, 0.65) == []  # busy: nothing by the rule, not promoted
    [(job, promoted)] = queue.release(50 * 60.0, 0.65)
    assert promoted
    assert job.arrival_s == 0.0


def test_the_simulated_queue_keeps_the_age_bound_for_a_day_window_and_no_deadline() -> None:
    queue = NiwQueue(DEFAULT_RELEASE_RULE)
    queue.push(_job(0.0, DAY, 1))
    queue.push(_job(0.0, None, 2))
    assert queue.release(10 * HOUR - 1, 0.95) == []
    released = queue.release(10 * HOUR, 0.95)
    assert [promoted for _, promoted in released] == [True, True]


class _BusyRegion:
    """Interactive load far past one instance's capacity (utilisation 1), plus a little NIW."""

    def rates(self, t0: float, t1: float) -> dict[tuple[str, str], StepRates]:
        return {("org/m", "region-a"): StepRates(0.0, 6000.0, 5.0)}

    def lengths(self, model: str) -> Lengths:
        return Lengths(400.0, 200.0)


def test_the_fluid_simulator_promotes_by_the_model_deadline(tmp_path: Path) -> None:
    niw = "  niw:\n    deadlineSeconds: 7200\n"
    fleet = write_fleet(tmp_path, pool_yaml(), model_yaml(regions=(("pool-a", 1, 1),)) + niw)
    options = SimOptions(
        duration_s=2 * HOUR, scaling=False, profiles={("ns/m", "pool-a"): VTC_A10G}
    )
    results = simulate_fluid(fleet, _BusyRegion(), options)
    # Nothing is released by the rule on a saturated region; what left the queue was promoted
    # (after 50 min of its 2 h window). Before, promotion waited 10 h: nothing at all.
    assert results.niw.promoted > 0
