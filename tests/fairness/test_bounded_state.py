"""Per-tenant state of the limiter and of WSC's scale memo stays bounded under one-off tenants.

The sidecar takes the tenant from a header or the OpenAI `user` field, which may name every end
user: state kept per tenant must be dropped again, or a long-running pod grows without bound.
"""

from __future__ import annotations

import pytest

from fleetwarden.fairness import limits, wsc
from fleetwarden.fairness.limits import Limits, RateLimiter
from fleetwarden.fairness.request import Request
from fleetwarden.fairness.wsc import WeightedServiceCounter


def test_the_limiter_prunes_itself_as_one_off_tenants_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "PRUNE_EVERY", 100)
    limiter = RateLimiter(default=Limits(rpm=10), window_s=60.0)
    for i in range(1_000):  # one request per tenant, one per second: each window empties in 60 s
        limiter.record(f"user-{i}", None, 10, float(i))
    assert len(limiter._windows) <= 100 + 60
    # Pruning never forgets a window that still counts: the last tenant is still limited.
    assert limiter.usage("user-999", None, 999.0)[limits.ThrottleReason.TENANT_RPM] == 1


def test_the_wsc_scale_memo_starts_over_when_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wsc, "MAX_MEMOISED_SCALES", 4)
    factors = {f"user-{i}": 0.5 + i / 10 for i in range(10)}
    memo = WeightedServiceCounter(priority_factors=factors)
    fresh = WeightedServiceCounter(priority_factors=lambda t: factors[t])  # no memo
    for policy in (memo, fresh):
        for seq, tenant in enumerate(factors):
            request = Request(seq, tenant, 0.0, 10, 10)
            policy.push(request, 0.0)
            policy.charge(request, output_tokens=3, now=1.0)
    assert memo._scales is not None
    assert len(memo._scales) <= 4
    assert fresh._scales is None
    assert memo.counters == fresh.counters
