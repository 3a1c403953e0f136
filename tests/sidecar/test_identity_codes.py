"""Every malformed identity header is refused with the same OpenAI error code.

docs/sidecar.md promises `invalid_header` for a malformed identity header, so a client (or a
gateway's error mapping) can tell "fix this header" apart from other 400s. The tier and deadline
headers used to answer 400 with `code: null`.
"""

from __future__ import annotations

import aiohttp
import pytest

from fleetwarden.sidecar.errors import ApiError
from fleetwarden.sidecar.identity import InteractionTokens, resolve_identity
from tests.support.sidecar_stack import fairness_config, running_sidecar, running_stub

TOKENS = InteractionTokens(b"k" * 32, ttl_s=60)
CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

BAD_HEADERS = [
    {"x-fleetwarden-tenant": "bad tenant"},
    {"x-fleetwarden-app": "a\tb"},
    {"x-fleetwarden-stage": "x" * 200},
    {"x-fleetwarden-tier": "gold"},
    {"x-fleetwarden-deadline-ms": "soon"},
    {"x-fleetwarden-deadline-ms": "-5"},
    {"x-fleetwarden-deadline-ms": "nan"},
    {"x-fleetwarden-deadline-ms": "86400000"},
]


@pytest.mark.parametrize("headers", BAD_HEADERS)
def test_each_bad_identity_header_has_code_invalid_header(headers: dict[str, str]) -> None:
    with pytest.raises(ApiError) as caught:
        resolve_identity(
            headers, None, tenant_header="x-fleetwarden-tenant", tokens=TOKENS, now_unix=1000.0
        )
    assert caught.value.status == 400
    assert caught.value.code == "invalid_header"
    assert caught.value.param == next(iter(headers))


async def test_the_sidecar_answers_invalid_header_for_a_bad_tier_and_deadline() -> None:
    """The code reaches the client in the OpenAI error body, not only the exception."""
    async with (
        running_stub(time_scale=0.1) as stub,
        running_sidecar(stub.url, fairness_config()) as sc,
    ):
        async with aiohttp.ClientSession() as http:
            for header, value in (
                ("x-fleetwarden-tier", "gold"),
                ("x-fleetwarden-deadline-ms", "soon"),
            ):
                async with http.post(
                    f"{sc.url}/v1/chat/completions", json=CHAT, headers={header: value}
                ) as r:
                    assert r.status == 400
                    error = (await r.json())["error"]
                assert error["code"] == "invalid_header", (header, error)
                assert error["param"] == header
    assert stub.engine.requests_total == 0
