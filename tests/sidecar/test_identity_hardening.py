"""Interaction tokens cannot outlive their TTL, retired keys retire, identity headers come once.

Found by a security review: a token re-issued on every response with a fresh expiry kept one
interaction a never-throttled continuation for ever; the key replaced by a rotation verified
tokens (with any expiry) until the next rotation; and a repeated tenant header was accounted to
its first value, the client's when a gateway appends its own.
"""

from __future__ import annotations

import base64
import json
import time

import aiohttp
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from fleetwarden.sidecar import identity as identity_module
from fleetwarden.sidecar.errors import ApiError
from fleetwarden.sidecar.identity import (
    APP_HEADER,
    DEADLINE_HEADER,
    INTERACTION_HEADER,
    STAGE_HEADER,
    TIER_HEADER,
    InteractionTokens,
    resolve_identity,
)
from tests.support.sidecar_stack import running_sidecar, running_stub

KEY, OTHER_KEY = b"k" * 32, b"n" * 32
TENANT_HEADER = "x-fleetwarden-tenant"
CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def expiry_of(token: str) -> int:
    payload = token.split(".")[0]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return int(claims["e"])


def test_a_chained_interaction_ends_one_ttl_after_its_first_call() -> None:
    tokens = InteractionTokens(KEY, ttl_s=60)
    token = tokens.issue("acme", "job-1", now_unix=1000.0)
    for now in (1020.0, 1040.0, 1059.0):  # each call sends the token the previous one returned
        assert tokens.verify(token, "acme", now) == "job-1"
        token = tokens.issue("acme", "job-1", now)
    assert expiry_of(token) == 1060
    assert tokens.verify(token, "acme", 1061.0) is None


def test_a_new_interaction_gets_a_fresh_ttl_and_the_expiry_map_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(identity_module, "MAX_REMEMBERED_INTERACTIONS", 3)
    tokens = InteractionTokens(KEY, ttl_s=60)
    for n in range(10):
        assert tokens.verify(tokens.issue("acme", f"i-{n}", 1000.0), "acme", 1001.0) == f"i-{n}"
    assert len(tokens._expiries) <= 3
    assert expiry_of(tokens.issue("acme", "never-seen", 2000.0)) == 2060


async def test_the_sidecar_reissues_a_token_with_its_original_expiry() -> None:
    """Through app.py's own call site: the response token keeps the request token's expiry."""
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        started = time.time() - 100  # the interaction began 100 s ago
        token = sc.state.tokens.issue("acme", "job-1", now_unix=started)
        headers = {TENANT_HEADER: "acme", INTERACTION_HEADER: token}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{sc.url}/v1/chat/completions", json=CHAT, headers=headers) as r:
                assert r.status == 200
                reissued = r.headers[INTERACTION_HEADER]
    assert sc.state.tokens.verify(reissued, "acme", time.time()) == "job-1"
    assert expiry_of(reissued) == expiry_of(token)


def test_the_previous_key_verifies_only_tokens_expiring_within_a_ttl_of_the_rotation() -> None:
    tokens = InteractionTokens(KEY, ttl_s=60)
    before = tokens.issue("acme", "i-1", now_unix=999.0)
    tokens.rekey(OTHER_KEY, now_unix=1000.0)
    assert tokens.verify(before, "acme", now_unix=1030.0) == "i-1"  # under way: continues
    reissued = tokens.issue("acme", "i-1", now_unix=1030.0)  # new key, original expiry
    assert expiry_of(reissued) == expiry_of(before)
    retired = InteractionTokens(KEY, ttl_s=60)  # whoever still holds the old key
    minted = retired.issue("acme", "forged", now_unix=1100.0)
    assert tokens.verify(minted, "acme", now_unix=1100.0) is None


def test_the_previous_key_retires_one_ttl_after_a_rotation_without_a_given_time() -> None:
    """The secret watcher rekeys without a time: the wall clock is the rotation time."""
    tokens = InteractionTokens(KEY, ttl_s=60)
    tokens.rekey(OTHER_KEY)
    later = time.time() + 3600
    minted = InteractionTokens(KEY, ttl_s=60).issue("acme", "forged", now_unix=later)
    assert tokens.verify(minted, "acme", now_unix=later) is None


def test_a_token_expiring_beyond_one_ttl_is_refused_even_with_the_current_key() -> None:
    tokens = InteractionTokens(KEY, ttl_s=60)
    far = InteractionTokens(KEY, ttl_s=10 * 365 * 86400).issue("acme", "far", now_unix=1000.0)
    assert tokens.verify(far, "acme", now_unix=1000.0) is None
    skewed = InteractionTokens(KEY, ttl_s=60).issue("acme", "skewed", now_unix=1010.0)
    assert tokens.verify(skewed, "acme", now_unix=1000.0) == "skewed"  # a pod 10 s ahead


@pytest.mark.parametrize(
    ("header", "first", "second"),
    [
        (TENANT_HEADER, "victim", "mallory"),
        (APP_HEADER, "a", "b"),
        (TIER_HEADER, "niw", "iw-f"),
        (DEADLINE_HEADER, "5000", "1"),
        (STAGE_HEADER, "plan", "act"),
        (INTERACTION_HEADER, "x.y", "z.w"),
    ],
)
def test_a_repeated_identity_header_is_invalid_header(header: str, first: str, second: str) -> None:
    repeated = CIMultiDictProxy(CIMultiDict([(header, first), (header.upper(), second)]))
    tokens = InteractionTokens(KEY, ttl_s=60)
    with pytest.raises(ApiError) as caught:
        resolve_identity(
            repeated, None, tenant_header=TENANT_HEADER, tokens=tokens, now_unix=1000.0
        )
    assert (caught.value.status, caught.value.code, caught.value.param) == (
        400,
        "invalid_header",
        header,
    )
    once = CIMultiDictProxy(CIMultiDict([(header, first)]))
    resolve_identity(once, None, tenant_header=TENANT_HEADER, tokens=tokens, now_unix=1000.0)


async def test_the_sidecar_refuses_a_repeated_tenant_header() -> None:
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        headers = CIMultiDict([(TENANT_HEADER, "victim"), (TENANT_HEADER, "mallory")])
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{sc.url}/v1/chat/completions", json=CHAT, headers=headers) as r:
                assert r.status == 400
                error = (await r.json())["error"]
    assert (error["code"], error["param"]) == ("invalid_header", TENANT_HEADER)
    assert stub.engine.requests_total == 0
