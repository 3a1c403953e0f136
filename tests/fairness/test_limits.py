"""Sliding windows, user-then-application rate limits, and FairServe's OIT against plain RPM.

Times are drawn as integer microseconds and passed as seconds (`us / 1e6`), the resolution the
limiter works at, so "one microsecond earlier" is a meaningful moment.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.api.enums import LengthPrediction, Ordering, PolicyName, QuantumUnit, Tier
from fleetwarden.fairness.config import (
    ApplicationConfig,
    DpaConfig,
    DrrConfig,
    FairnessConfig,
    GateConfig,
    TenantConfig,
    TierConfig,
    TokenWeightsConfig,
)
from fleetwarden.fairness.limits import (
    ALLOWED,
    Decision,
    Limits,
    OverloadInteractionThrottle,
    RateLimiter,
    SlidingWindowCounter,
    ThrottleReason,
    is_overloaded,
)

WINDOW_US = 60_000_000
US = 1e-6
FAST = settings(max_examples=60, deadline=None)


def s(us: int) -> float:
    return us / 1e6


# Non-decreasing event times, dense enough that windows fill and expire.
steps_us = st.lists(st.integers(min_value=0, max_value=25_000_000), min_size=1, max_size=40)


def _times(steps: list[int]) -> list[int]:
    out, now = [], 0
    for step in steps:
        now += step
        out.append(now)
    return out


# ---- SlidingWindowCounter ----------------------------------------------------------------------


@FAST
@given(
    ops=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=30_000_000),
            st.booleans(),
            st.integers(min_value=0, max_value=500),
        ),
        max_size=60,
    )
)
def test_window_equals_brute_force(ops: list[tuple[int, bool, int]]) -> None:
    window, events, now = SlidingWindowCounter(), [], 0
    for step, is_add, amount in ops:
        now += step
        if is_add:
            window.add(amount, s(now))
            events.append((now, amount))
        expected = sum(a for t, a in events if now - WINDOW_US < t <= now)
        assert window.total(s(now)) == expected


def test_event_leaves_exactly_window_after() -> None:
    window = SlidingWindowCounter(window_s=60.0)
    window.add(3, 10.0)
    assert window.total(70.0 - US) == 3
    assert window.total(70.0) == 0


def test_time_running_backwards_is_taken_as_latest() -> None:
    window = SlidingWindowCounter(window_s=1.0)
    window.add(1, 5.0)
    window.add(1, 4.0)  # stamped late: counted at 5.0, never before an earlier event
    assert window.total(5.0) == 2
    assert window.total(6.0) == 0


@FAST
@given(
    steps=steps_us,
    amounts=st.lists(st.integers(min_value=1, max_value=50), min_size=40, max_size=40),
    amount=st.integers(min_value=1, max_value=60),
    limit=st.integers(min_value=0, max_value=300),
)
def test_window_retry_after_is_exact(
    steps: list[int], amounts: list[int], amount: int, limit: int
) -> None:
    window = SlidingWindowCounter()
    times = _times(steps)
    for t, a in zip(times, amounts, strict=False):
        window.add(a, s(t))
    now = times[-1]
    retry = window.retry_after_s(amount, limit, s(now))
    if amount > limit:
        assert retry == math.inf
        return
    wait_us = round(retry * 1e6)
    assert wait_us / 1e6 == retry
    if wait_us > 0:
        assert window.total(s(now + wait_us - 1)) + amount > limit
    assert window.total(s(now + wait_us)) + amount <= limit


# ---- RateLimiter -------------------------------------------------------------------------------


def test_user_limit_is_checked_before_application_limit() -> None:
    limiter = RateLimiter({"u": Limits(rpm=1, tpm=100)}, applications={"a": {"rpm": 1, "tpm": 100}})
    limiter.record("u", "a", 10, 0.0)
    assert limiter.check("u", "a", 10, 1.0).reason == "tenant-rpm"
    # Tenant TPM comes before application RPM too.
    limiter = RateLimiter({"u": {"tpm": 100}}, applications={"a": {"rpm": 1}})
    limiter.record("u", "a", 95, 0.0)
    assert limiter.check("u", "a", 10, 1.0).reason is ThrottleReason.TENANT_TPM
    # Only the application is over: the application is reported.
    assert limiter.check("v", "a", 10, 1.0).reason == "app-rpm"


def test_retry_after_covers_every_violated_limit() -> None:
    limiter = RateLimiter({"u": {"rpm": 1}}, applications={"a": {"rpm": 1}})
    limiter.record("u", "a", 0, 0.0)
    limiter.record("v", "a", 0, 30.0)  # the app window frees later than the user's
    decision = limiter.check("u", "a", 0, 31.0)
    assert decision == Decision(False, ThrottleReason.TENANT_RPM, 59.0)


def test_unknown_tenants_get_defaults_unknown_apps_and_none_are_unlimited() -> None:
    limiter = RateLimiter({"vip": {"rpm": None}}, default={"rpm": 1})
    for t in range(5):
        assert limiter.admit("vip", "whatever", 10, float(t)).allowed
    assert limiter.admit("stranger", None, 10, 0.0).allowed
    assert limiter.admit("stranger", None, 10, 1.0) == Decision(
        False, ThrottleReason.TENANT_RPM, 59.0
    )
    assert limiter.tenant_limits("other") == Limits(rpm=1)
    assert limiter.app_limits("whatever") == Limits()


def test_a_single_request_over_the_limit_never_fits() -> None:
    limiter = RateLimiter(default={"tpm": 100})
    assert limiter.check("u", None, 101, 0.0) == Decision(
        False, ThrottleReason.TENANT_TPM, math.inf
    )


def test_output_tokens_recorded_later_count_in_tpm_only() -> None:
    limiter = RateLimiter(default={"rpm": 10, "tpm": 100}, applications={"a": {"tpm": 1000}})
    limiter.record("u", "a", 20, 0.0)
    limiter.record_tokens("u", "a", 70, 5.0)
    assert limiter.usage("u", "a", 5.0) == {"tenant-rpm": 1, "tenant-tpm": 90, "app-tpm": 90}
    assert limiter.check("u", "a", 20, 6.0) == Decision(False, ThrottleReason.TENANT_TPM, 54.0)
    assert limiter.usage("u", "a", 60.0) == {"tenant-rpm": 0, "tenant-tpm": 70, "app-tpm": 70}
    assert limiter.prune(65.0) == 3  # the app has no RPM limit, so no RPM window
    assert limiter.usage("u", "a", 65.0) == {"tenant-rpm": 0, "tenant-tpm": 0, "app-tpm": 0}


def _config() -> FairnessConfig:
    tenant = TenantConfig(weight=1.0, tier=Tier.IW_NORMAL, priority_factor=1.0)
    body: dict[str, object] = {
        "source": "default",
        "served_model": "m",
        "policy": PolicyName.WSC,
        "ordering": Ordering.FIFO,
        "token_weights": TokenWeightsConfig(input=1, system=2, output=1),
        "length_prediction": LengthPrediction.NONE,
        "tenants": {"alice": tenant.model_copy(update={"rpm": 2, "tpm": 50})},
        "defaults": tenant.model_copy(update={"rpm": 1}),
        "applications": {"chat": ApplicationConfig(rpm=3)},
        "interaction_throttling": True,
        "early_rejection": False,
        "overload_kv_utilization": 0.9,
        "drr": DrrConfig(unit=QuantumUnit.TOKENS, quantum={Tier.IW_NORMAL: 100}),
        "dpa": DpaConfig(severely_expired_s=10, urgent_within_s=1),
        "tiers": {Tier.IW_NORMAL: TierConfig(ttft_s=1, tbt_s=0.1)},
        "gate": GateConfig(max_waiting_requests=10, telemetry_max_age_s=5),
        "tenant_header": "x-tenant",
    }
    return FairnessConfig.model_validate(body)


def test_from_config() -> None:
    limiter = RateLimiter.from_config(_config())
    assert limiter.tenant_limits("alice") == Limits(rpm=2, tpm=50)
    assert limiter.tenant_limits("bob") == Limits(rpm=1)
    assert limiter.app_limits("chat") == Limits(rpm=3)
    tenants = ["alice", "alice", "alice", "bob", "bob"]
    allowed = [limiter.admit(t, "chat", 1, 0.0).allowed for t in tenants]
    assert allowed == [True, True, False, True, False]
    assert limiter.admit("carol", "chat", 1, 0.0).reason == "app-rpm"


requests = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=8_000_000),  # step to the next arrival
        st.sampled_from(["u1", "u2", "u3"]),
        st.sampled_from(["a1", "a2", None]),
        st.integers(min_value=0, max_value=40),  # tokens
    ),
    min_size=1,
    max_size=50,
)


def _limiter() -> RateLimiter:
    return RateLimiter(
        {"u1": {"rpm": 3, "tpm": 80}, "u2": {"rpm": 5}},
        default={"tpm": 60},
        applications={"a1": {"rpm": 4}, "a2": {"rpm": 6, "tpm": 100}},
    )


Arrival = tuple[int, str, str | None, int]


def _all_usage(limiter: RateLimiter, now_us: int) -> list[dict[ThrottleReason, int]]:
    return [limiter.usage(u, a, s(now_us)) for u in ("u1", "u2", "u3") for a in ("a1", "a2")]


@FAST
@given(reqs=requests)
def test_denied_request_changes_no_window(reqs: list[Arrival]) -> None:
    """About 60% of these sequences have denials; each must leave every window as it was."""
    limiter, now = _limiter(), 0
    for step, tenant, app, tokens in reqs:
        now += step
        before = _all_usage(limiter, now)
        decision = limiter.admit(tenant, app, tokens, s(now))
        if not decision.allowed:
            assert _all_usage(limiter, now) == before


@FAST
@given(reqs=requests)
def test_retry_after_is_exact(reqs: list[Arrival]) -> None:
    """Waiting `retry_after_s` makes the same check pass; one microsecond less does not."""
    limiter, now = _limiter(), 0
    admitted: list[tuple[str, str | None, int, int]] = []
    for step, tenant, app, tokens in reqs:
        now += step
        decision = limiter.admit(tenant, app, tokens, s(now))
        if decision.allowed:
            admitted.append((tenant, app, tokens, now))
            continue
        if decision.retry_after_s == math.inf:
            continue
        wait_us = round(decision.retry_after_s * 1e6)
        assert wait_us > 0
        assert wait_us / 1e6 == decision.retry_after_s
        for probe_at, passes in ((now + wait_us - 1, False), (now + wait_us, True)):
            probe = _limiter()  # a replay, as probing later would move `limiter`'s clock
            for t2, a2, k2, at in admitted:
                probe.record(t2, a2, k2, s(at))
            assert probe.check(tenant, app, tokens, s(probe_at)).allowed is passes


@FAST
@given(
    n=st.integers(min_value=1, max_value=5),
    steps=st.lists(st.integers(min_value=0, max_value=20_000_000), min_size=1, max_size=60),
)
def test_rpm_n_admits_exactly_n_per_window(n: int, steps: list[int]) -> None:
    limiter = RateLimiter(default={"rpm": n})
    admitted: list[int] = []
    for t in _times(steps):
        in_window = sum(1 for a in admitted if t - WINDOW_US < a <= t)
        decision = limiter.admit("u", None, 1, s(t))
        # Denied exactly when the window already holds n: never more, and no idle capacity lost.
        assert decision.allowed == (in_window < n)
        if decision.allowed:
            admitted.append(t)
    for t in admitted:
        assert sum(1 for a in admitted if t - WINDOW_US < a <= t) <= n


# ---- OIT ---------------------------------------------------------------------------------------


def test_oit_serves_an_idle_engine_that_plain_rpm_throttles() -> None:
    """One user sends 5 requests in 4 s to an idle engine with a 2 RPM limit."""
    plain = RateLimiter(default={"rpm": 2})
    oit = OverloadInteractionThrottle(RateLimiter(default={"rpm": 2}))
    arrivals = [0.0, 1.0, 2.0, 3.0, 4.0]
    plain_allowed = [plain.admit("u", "a", 1, t).allowed for t in arrivals]
    oit_allowed = [
        oit.check("u", "a", 1, t, overloaded=False, continuation=False).allowed for t in arrivals
    ]
    assert plain_allowed == [True, True, False, False, False]
    assert oit_allowed == [True] * 5
    # The idle-time arrivals were counted: once overloaded, the user is over the limit at once.
    assert oit.check("u", "a", 1, 5.0, overloaded=True, continuation=False) == Decision(
        False, ThrottleReason.TENANT_RPM, 58.0
    )
    # ... but a call inside an interaction already running still goes through.
    assert oit.check("u", "a", 1, 5.0, overloaded=True, continuation=True).allowed


flags = st.lists(st.tuples(st.booleans(), st.booleans()), max_size=50)


@FAST
@given(reqs=requests)
def test_oit_never_throttles_when_not_overloaded(reqs: list[Arrival]) -> None:
    oit, now = OverloadInteractionThrottle(_limiter()), 0
    for step, tenant, app, tokens in reqs:
        now += step
        assert oit.check(tenant, app, tokens, s(now), overloaded=False, continuation=False).allowed


@FAST
@given(reqs=requests, flags=flags)
def test_oit_never_throttles_a_continuation(
    reqs: list[Arrival], flags: list[tuple[bool, bool]]
) -> None:
    oit, now = OverloadInteractionThrottle(_limiter()), 0
    for (step, tenant, app, tokens), (overloaded, continuation) in zip(reqs, flags, strict=False):
        now += step
        decision = oit.check(
            tenant, app, tokens, s(now), overloaded=overloaded, continuation=continuation
        )
        if continuation or not overloaded:
            assert decision.allowed


@FAST
@given(reqs=requests)
def test_oit_under_overload_is_the_plain_limiter(reqs: list[Arrival]) -> None:
    oit, plain, now = OverloadInteractionThrottle(_limiter()), _limiter(), 0
    for step, tenant, app, tokens in reqs:
        now += step
        assert oit.check(
            tenant, app, tokens, s(now), overloaded=True, continuation=False
        ) == plain.admit(tenant, app, tokens, s(now))


@pytest.mark.parametrize(
    ("kv", "gate_full", "expected"),
    [
        (0.5, False, False),
        (0.9, False, True),  # at the threshold is overloaded
        (0.95, False, True),
        (0.5, True, True),
        (None, False, False),  # unknown telemetry is no evidence of overload
        (None, True, True),  # but a full gate is
        (math.nan, False, False),
    ],
)
def test_is_overloaded(kv: float | None, gate_full: bool, expected: bool) -> None:
    assert is_overloaded(kv, 0.9, gate_full) is expected


def test_check_on_a_window_never_recorded_matches_an_empty_counter() -> None:
    """`check` answers for a limited window nobody has recorded into without building one: the
    same decision and retry as an empty `SlidingWindowCounter` gives, and a window under 1 us
    still fails where it did (at the check)."""
    limiter = RateLimiter({"t": Limits(rpm=2, tpm=100)})
    assert limiter.check("t", None, 100, 1.0) == ALLOWED
    refused = limiter.check("t", None, 101, 1.0)
    empty = SlidingWindowCounter().retry_after_s(101, 100, 1.0)
    assert refused == Decision(False, ThrottleReason.TENANT_TPM, empty)
    assert refused.retry_after_s == math.inf
    with pytest.raises(ValueError, match="window must be at least 1 us"):
        RateLimiter({"t": Limits(rpm=2)}, window_s=0.0).check("t", None, 1, 1.0)


def test_oit_decide_records_nothing_and_checks_the_user_first() -> None:
    """`decide` is the scheduler's OIT question: it must leave the windows as they were (the
    request may still be rejected early) and report the user's limit before the application's."""
    limiter = RateLimiter(default={"rpm": 1}, applications={"a": {"rpm": 1}})
    oit = OverloadInteractionThrottle(limiter)
    assert oit.decide("u", "a", 1, 0.0, overloaded=True, continuation=False).allowed
    assert limiter.usage("u", "a", 0.0) == {ThrottleReason.TENANT_RPM: 0, ThrottleReason.APP_RPM: 0}
    limiter.record("u", "a", 1, 0.0)
    refused = oit.decide("u", "a", 1, 1.0, overloaded=True, continuation=False)
    assert refused.reason is ThrottleReason.TENANT_RPM
    assert oit.decide("u", "a", 1, 1.0, overloaded=True, continuation=True).allowed
    assert oit.decide("u", "a", 1, 1.0, overloaded=False, continuation=False).allowed
    assert limiter.usage("u", "a", 1.0) == {ThrottleReason.TENANT_RPM: 1, ThrottleReason.APP_RPM: 1}
