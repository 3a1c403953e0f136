"""Identity: tenant precedence, header validation, and unforgeable interaction tokens."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetwarden.api.enums import Tier
from fleetwarden.sidecar.errors import ApiError
from fleetwarden.sidecar.identity import InteractionTokens, resolve_identity

TOKENS = InteractionTokens(b"k" * 32, ttl_s=60)


def identity(headers: dict[str, str], user: object = None, now: float = 1000.0):  # type: ignore[no-untyped-def]
    return resolve_identity(
        headers, user, tenant_header="x-fleetwarden-tenant", tokens=TOKENS, now_unix=now
    )


def test_tenant_from_trusted_header_then_user_then_default() -> None:
    assert identity({"x-fleetwarden-tenant": "acme"}, "bob").tenant == "acme"
    assert identity({}, "bob").tenant == "bob"
    assert identity({}, None).tenant == "default"
    assert identity({}, "").tenant == "default"


def test_tier_stage_app_and_deadline_headers() -> None:
    who = identity(
        {
            "x-fleetwarden-app": "agent",
            "x-fleetwarden-tier": "iw-f",
            "x-fleetwarden-stage": "plan",
            "x-fleetwarden-deadline-ms": "250",
        }
    )
    assert (who.app, who.tier, who.stage, who.deadline_ms) == ("agent", Tier.IW_FAST, "plan", 250.0)


@pytest.mark.parametrize(
    "headers",
    [
        {"x-fleetwarden-tenant": "bad tenant"},
        {"x-fleetwarden-tenant": "x" * 200},
        {"x-fleetwarden-tier": "gold"},
        {"x-fleetwarden-deadline-ms": "soon"},
        {"x-fleetwarden-deadline-ms": "-5"},
        {"x-fleetwarden-app": "a\tb"},
    ],
)
def test_bad_identity_headers_are_400(headers: dict[str, str]) -> None:
    with pytest.raises(ApiError) as caught:
        identity(headers)
    assert caught.value.status == 400
    assert caught.value.param


def test_valid_token_continues_the_interaction() -> None:
    token = TOKENS.issue("acme", "job-1", now_unix=1000.0)
    who = identity({"x-fleetwarden-tenant": "acme", "x-fleetwarden-interaction": token}, now=1030.0)
    assert (who.interaction, who.continuation) == ("job-1", True)


def test_expired_foreign_and_forged_tokens_start_a_new_interaction() -> None:
    token = TOKENS.issue("acme", "job-1", now_unix=1000.0)
    expired = identity(
        {"x-fleetwarden-tenant": "acme", "x-fleetwarden-interaction": token}, now=1061.0
    )
    foreign = identity({"x-fleetwarden-tenant": "evil", "x-fleetwarden-interaction": token})
    other_key = InteractionTokens(b"z" * 32).issue("acme", "job-1", 1000.0)
    forged = identity({"x-fleetwarden-tenant": "acme", "x-fleetwarden-interaction": other_key})
    for who in (expired, foreign, forged):
        assert not who.continuation
        assert who.interaction != "job-1"


@given(st.text(max_size=300))
def test_arbitrary_tokens_never_raise_and_never_continue(token: str) -> None:
    assert TOKENS.verify(token, "acme", 1000.0) is None


@given(st.binary(min_size=0, max_size=8))
def test_tampering_with_any_byte_of_a_token_invalidates_it(noise: bytes) -> None:
    token = TOKENS.issue("acme", "job-1", 1000.0)
    payload, signature = token.split(".")
    tampered = payload[:-1] + ("A" if payload[-1] != "A" else "B") + "." + signature
    assert TOKENS.verify(tampered, "acme", 1000.0) is None
    assert TOKENS.verify(token + noise.hex(), "acme", 1000.0) in (None, "job-1")
    assert TOKENS.verify(token, "acme", 1000.0) == "job-1"
