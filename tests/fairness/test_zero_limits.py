"""A rate limit of 0 (or less) is refused wherever a sidecar's config is made, as the CRD refuses it.

A sidecar running `rpm: 0` answered every request 429 with `Retry-After: 60`, which OpenAI SDKs
retry forever. The TenantPolicy CRD has always refused 0 (`minimum: 1`, None means unlimited), but
the rendered `FairnessConfig` took any integer, so a hand-written `--config` or an admin push
could carry one (and a negative limit passed validation, then failed half-way through a sidecar's
reconfiguration). The library's `Limits` keeps 0 as "no request fits" for direct callers such as
`fleetwarden replay --rpm 0`, where every request counts as throttled and nothing waits.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import ValidationError

from fleetwarden.api.v1alpha1.modeldeployment import SidecarSettings, TierSettings
from fleetwarden.api.v1alpha1.tenantpolicy import (
    ApplicationSettings,
    TenantDefaults,
    TenantPolicySpec,
    TenantSettings,
)
from fleetwarden.fairness.config import (
    ApplicationConfig,
    FairnessConfig,
    TenantConfig,
)
from fleetwarden.fairness.limits import Limits, OverloadInteractionThrottle, RateLimiter
from fleetwarden.fairness.render import render_config, standalone_config
from fleetwarden.fairness.request import Request
from fleetwarden.fairness.scheduler import FairScheduler
from fleetwarden.sim import replay_report
from fleetwarden.sim.profiles import VTC_A10G
from fleetwarden.sim.synthetic import constant_rate_trace

FIELDS = [
    ("defaults", "rpm"),
    ("defaults", "tpm"),
    ("tenants", "rpm"),
    ("tenants", "tpm"),
    ("applications", "rpm"),
    ("applications", "tpm"),
]


def document_with(where: str, field: str, value: object) -> str:
    """A valid config document (one named tenant, one application) with one limit set."""
    body: dict[str, Any] = json.loads(standalone_config("m").to_document())
    body["tenants"] = {"alice": dict(body["defaults"])}
    body["applications"] = {"bot": {"rpm": None, "tpm": None, "stages": {}}}
    target = {
        "defaults": body["defaults"],
        "tenants": body["tenants"]["alice"],
        "applications": body["applications"]["bot"],
    }[where]
    target[field] = value
    return json.dumps(body)


@pytest.mark.parametrize(("where", "field"), FIELDS)
@pytest.mark.parametrize("value", [0, -1])
def test_a_config_with_a_limit_under_one_is_refused(where: str, field: str, value: int) -> None:
    with pytest.raises(ValidationError) as caught:
        FairnessConfig.from_document(document_with(where, field, value))
    (error,) = caught.value.errors()
    assert error["loc"][0] == where
    assert error["loc"][-1] == field
    assert error["type"] == "greater_than_equal"


@pytest.mark.parametrize("value", [0, -5])
def test_the_config_models_refuse_it_when_built_directly(value: int) -> None:
    with pytest.raises(ValidationError):
        TenantConfig(weight=1, tier="iw-n", priority_factor=1, rpm=value)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        ApplicationConfig(tpm=value)


@pytest.mark.parametrize(("where", "field"), FIELDS)
@pytest.mark.parametrize("value", [None, 1])
def test_unlimited_and_one_are_accepted_and_scheduled(
    where: str, field: str, value: int | None
) -> None:
    config = FairnessConfig.from_document(document_with(where, field, value))
    scheduler = FairScheduler(config)
    request = Request(seq=1, tenant="alice", arrival_s=0.0, input_tokens=1, max_output_tokens=1)
    request.app = "bot"
    assert scheduler.offer(request, 0.0).queued


def test_the_api_refuses_zero_the_same_way() -> None:
    """The config now says what the CRD always said: the two cannot drift apart silently."""
    for field in ("rpm", "tpm"):
        for build in (
            lambda f: TenantSettings(name="a", **{f: 0}),
            lambda f: TenantDefaults(**{f: 0}),
            lambda f: ApplicationSettings(name="a", **{f: 0}),
        ):
            with pytest.raises(ValidationError):
                build(field)
    spec = TenantPolicySpec(
        tenants=[TenantSettings(name="a", rpm=1, tpm=1)],
        defaults=TenantDefaults(rpm=1, tpm=1),
        applications=[ApplicationSettings(name="bot", rpm=1, tpm=1)],
    )
    rendered = render_config(
        served_model="m",
        spec=spec,
        tiers=TierSettings(),
        sidecar=SidecarSettings(),
        source="TenantPolicy ns/p",
    )
    assert rendered.defaults.rpm == 1
    assert rendered.applications["bot"].tpm == 1
    assert FairnessConfig.from_document(rendered.to_document()) == rendered


def test_the_library_keeps_zero_as_a_limit_no_request_fits() -> None:
    """Direct callers (replay) still get a plain refusal that never records, under OIT too."""
    limiter = RateLimiter(default=Limits(rpm=0), applications={"bot": Limits(tpm=0)})
    decision = limiter.admit("u", None, 0, 0.0)
    assert not decision.allowed
    assert decision.reason == "tenant-rpm"
    assert decision.retry_after_s == math.inf
    assert limiter.usage("u", None, 0.0) == {"tenant-rpm": 0}
    oit = OverloadInteractionThrottle(RateLimiter(default=Limits(rpm=0)))
    common = {"tenant": "u", "app": None, "tokens": 5, "now": 1.0}
    assert oit.check(**common, overloaded=False, continuation=False).allowed
    assert oit.check(**common, overloaded=True, continuation=True).allowed
    refused = oit.check(**common, overloaded=True, continuation=False)
    assert not refused.allowed
    assert refused.retry_after_s == math.inf


@pytest.mark.parametrize("policy", ["rpm", "wsc-oit"])
def test_replay_with_rpm_zero_counts_refusals_and_ends(policy: str) -> None:
    """Nothing waits for a window that never opens: each request is throttled (or abandoned
    with its refused interaction) and the replay ends."""
    trace = list(constant_rate_trace({"a": 2.0, "b": 1.0}, 20))
    report = replay_report.run(trace, policy, VTC_A10G, replay_report.Options(rpm=0))
    assert report["requests"] == len(trace) > 0
    assert math.isfinite(report["duration_s"])
    if policy == "rpm":
        assert report["throttled"] + report["abandoned"] == len(trace)
        assert report["served"] == 0
    else:  # OIT refuses only under overload: what ran was admitted while the engine had room
        assert report["served"] + report["throttled"] + report["abandoned"] == len(trace)
        assert report["served"] > 0
        assert report["throttled"] > 0
