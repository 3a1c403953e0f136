"""Who is asking: tenant, application, tier, deadline and interaction of an incoming call.

The tenant comes from a header the gateway sets (trusted: the sidecar is not exposed directly),
else the OpenAI `user` field, else `default`. Interactions (FairServe's multi-call agent tasks)
are tracked with a continuation token the sidecar hands out on the first call: an HMAC over the
tenant, the interaction id and an expiry, so a client cannot claim to be mid-interaction to dodge
throttling, nor reuse another tenant's token. A forged, expired or foreign token is simply a new
interaction. Everything here is pure; the caller passes the wall-clock time for token expiry.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from fleetwarden.api.enums import Tier
from fleetwarden.sidecar.errors import ApiError

APP_HEADER = "x-fleetwarden-app"
TIER_HEADER = "x-fleetwarden-tier"
DEADLINE_HEADER = "x-fleetwarden-deadline-ms"
"""Milliseconds from arrival by which the first token is due (EDF/DPA orderings)."""
STAGE_HEADER = "x-fleetwarden-stage"
INTERACTION_HEADER = "x-fleetwarden-interaction"
DEFAULT_TENANT = "default"
MIN_INTERACTION_SECRET_BYTES = 16
"""Shortest HMAC key accepted for interaction tokens (settings, start-up and rotation alike)."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,127}$")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _check_secret(secret: bytes) -> None:
    if len(secret) < MIN_INTERACTION_SECRET_BYTES:
        raise ValueError(
            f"the interaction secret must be at least {MIN_INTERACTION_SECRET_BYTES} bytes"
        )


class InteractionTokens:
    """Issue and verify signed, expiring interaction continuation tokens."""

    def __init__(self, secret: bytes, ttl_s: float = 900.0) -> None:
        _check_secret(secret)
        self._secret = secret
        self._previous: bytes | None = None
        self.ttl_s = ttl_s

    def rekey(self, secret: bytes) -> None:
        """Sign with `secret` from now on; tokens signed with the key it replaces still verify
        (pods of one Deployment see a rotated Secret at different times)."""
        _check_secret(secret)
        if secret != self._secret:
            self._previous, self._secret = self._secret, secret

    def _sign(self, payload: bytes, secret: bytes | None = None) -> str:
        key = self._secret if secret is None else secret
        return _b64(hmac.new(key, payload, hashlib.sha256).digest())

    def _signed(self, payload: bytes, signature: str) -> bool:
        """Whether `signature` is the current or the previous key's signature of `payload`."""
        # Compare bytes: compare_digest refuses non-ASCII str, and headers can carry anything.
        given = signature.encode("utf-8", "replace")
        if hmac.compare_digest(self._sign(payload).encode(), given):
            return True
        previous = self._previous
        return previous is not None and hmac.compare_digest(
            self._sign(payload, previous).encode(), given
        )

    def issue(self, tenant: str, interaction: str, now_unix: float) -> str:
        payload = json.dumps(
            {"t": tenant, "i": interaction, "e": int(now_unix + self.ttl_s)}, separators=(",", ":")
        ).encode()
        return f"{_b64(payload)}.{self._sign(payload)}"

    def verify(self, token: str, tenant: str, now_unix: float) -> str | None:
        """The interaction id of a valid token of `tenant`, or None (forged, expired, malformed)."""
        if len(token) > 1024 or token.count(".") != 1:
            return None
        encoded, signature = token.split(".")
        try:
            payload = _unb64(encoded)
        except (ValueError, TypeError):
            return None
        if not self._signed(payload, signature):
            return None
        try:
            claims = json.loads(payload)
        except ValueError:
            return None
        if not isinstance(claims, dict) or claims.get("t") != tenant:
            return None
        expiry, interaction = claims.get("e"), claims.get("i")
        if not isinstance(expiry, int) or not isinstance(interaction, str) or now_unix > expiry:
            return None
        return interaction


@dataclass(frozen=True, slots=True)
class Identity:
    tenant: str
    app: str | None
    tier: Tier | None
    """From the header; None means the tenant's configured tier."""
    deadline_ms: float | None
    stage: str | None
    interaction: str
    continuation: bool
    """True when a valid token named an interaction already admitted."""


def _checked_name(value: str, what: str, header: str) -> str:
    if not _NAME.match(value):
        raise ApiError(
            400,
            f"invalid {what} {value[:64]!r}: 1-128 characters of letters, digits and ._:@/+-",
            code="invalid_header",
            param=header,
        )
    return value


def resolve_identity(
    headers: Mapping[str, str],
    body_user: object,
    *,
    tenant_header: str,
    tokens: InteractionTokens,
    now_unix: float,
) -> Identity:
    """Read the caller's identity from headers and body; raises ApiError(400) on bad values."""
    raw_tenant = headers.get(tenant_header)
    if raw_tenant:
        tenant = _checked_name(raw_tenant, "tenant", tenant_header)
    elif isinstance(body_user, str) and body_user:
        tenant = _checked_name(body_user, "user", "user")
    else:
        tenant = DEFAULT_TENANT
    app_value = headers.get(APP_HEADER)
    app = _checked_name(app_value, "application", APP_HEADER) if app_value else None
    tier: Tier | None = None
    if tier_value := headers.get(TIER_HEADER):
        try:
            tier = Tier(tier_value)
        except ValueError:
            allowed = ", ".join(t.value for t in Tier)
            raise ApiError(
                400,
                f"invalid tier {tier_value[:32]!r}: one of {allowed}",
                code="invalid_header",
                param=TIER_HEADER,
            ) from None
    deadline_ms: float | None = None
    if deadline_value := headers.get(DEADLINE_HEADER):
        try:
            deadline_ms = float(deadline_value)
        except ValueError:
            deadline_ms = -1.0
        if not 0 < deadline_ms < 86_400_000:
            raise ApiError(
                400,
                "deadline must be a positive number of milliseconds",
                code="invalid_header",
                param=DEADLINE_HEADER,
            )
    stage_value = headers.get(STAGE_HEADER)
    stage = _checked_name(stage_value, "stage", STAGE_HEADER) if stage_value else None
    interaction: str | None = None
    if token := headers.get(INTERACTION_HEADER):
        interaction = tokens.verify(token, tenant, now_unix)
    continuation = interaction is not None
    return Identity(
        tenant=tenant,
        app=app,
        tier=tier,
        deadline_ms=deadline_ms,
        stage=stage,
        interaction=interaction or secrets.token_hex(8),
        continuation=continuation,
    )
