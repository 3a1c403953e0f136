"""One token, one tenant: an auth config that would give a token to two tenants is refused.

Before, a token listed in `tokens` for one tenant and, as its digest, in `token_sha256` for
another belonged silently to the second; and two digests differing only in case collapsed into
one with the last tenant winning.
"""

from __future__ import annotations

import hashlib

import pytest
from pydantic import ValidationError

from fleetwarden.batch.config import AuthConfig

TOKEN = "s3cret-token-value"
DIGEST = hashlib.sha256(TOKEN.encode()).hexdigest()


def test_a_token_in_both_maps_is_refused() -> None:
    with pytest.raises(ValidationError, match="listed in both"):
        AuthConfig(tokens={TOKEN: "team-a"}, token_sha256={DIGEST: "team-b"})


def test_a_digest_listed_twice_in_different_case_is_refused() -> None:
    with pytest.raises(ValidationError, match="listed for two tenants"):
        AuthConfig(token_sha256={DIGEST: "team-a", DIGEST.upper(): "team-b"})


def test_distinct_tokens_in_both_maps_are_kept() -> None:
    other = hashlib.sha256(b"another").hexdigest()
    auth = AuthConfig(tokens={TOKEN: "team-a"}, token_sha256={other.upper(): "team-b"})
    assert auth.digests() == {DIGEST: "team-a", other: "team-b"}


def test_the_same_tenant_twice_is_accepted() -> None:
    """Mid-migration from tokens to digests, or a Secret overlay merged over the config file,
    lists one token for one tenant twice: nothing is ambiguous."""
    auth = AuthConfig(
        tokens={TOKEN: "team-a"}, token_sha256={DIGEST: "team-a", DIGEST.upper(): "team-a"}
    )
    assert auth.digests() == {DIGEST: "team-a"}
