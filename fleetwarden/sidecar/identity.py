"""Who is asking: tenant, application, tier, deadline and interaction of an incoming call.

The tenant comes from a header the gateway sets (trusted: the sidecar is not exposed directly),
else the OpenAI `user` field, else `default`. Interactions (FairServe's multi-call agent tasks)
are tracked with a continuation token the sidecar hands out on the first call: an HMAC over the
tenant, the interaction id and an expiry, so a client cannot claim to be mid-interaction to dodge
throttling, nor reuse another tenant's token. A forged, expired or foreign token is simply a new
interaction.

An interaction lives at most one TTL from its first call: the token carries that first call's
expiry, and the token re-issued on each response keeps it (else one token, chained, would keep a
task a never-throttled continuation for ever). A token whose expiry lies further ahead than one
TTL (plus `CLOCK_SKEW_S`) was not issued by a sidecar with this TTL and is refused. After a key
rotation the previous key verifies only tokens that expire within one TTL of the rotation: all
it ever legitimately signed; someone holding the retired key mints nothing after that.

Identity headers must appear once: with a gateway that appends its tenant header rather than
replacing the client's, the first of two values is the client's, so a repeated header is a 400.

The caller passes the wall-clock time; only `rekey` reads the clock when not given one (the
secret watcher rotates keys without a time at hand).
"""

from __future__ import annotations

import base64
import hmac
import json
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from multidict import MultiMapping

from fleetwarden.api.enums import Tier
from fleetwarden.fairness.request import TIER_RANK
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
CLOCK_SKEW_S = 30.0
"""How far ahead of this pod's clock another pod's clock may run: slack on every expiry bound."""
MAX_REMEMBERED_INTERACTIONS = 10_000
"""Bound of the verify-to-issue map of original expiries. `issue` follows `verify` within one
request handler with no await between, so the map needs only the calls in progress; the bound
just keeps refused or abandoned calls from growing it."""
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))
"""One encoder for every token (`json.dumps` with separators builds one per call)."""
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


class _Key(Enum):
    CURRENT = "current"
    PREVIOUS = "previous"


class InteractionTokens:
    """Issue and verify signed, expiring interaction continuation tokens."""

    def __init__(self, secret: bytes, ttl_s: float = 900.0) -> None:
        _check_secret(secret)
        self._secret = secret
        self._previous: bytes | None = None
        self._previous_until = 0.0
        """The latest expiry a previous-key token may carry: rotation time + TTL + clock skew."""
        self._expiries: OrderedDict[tuple[str, str], int] = OrderedDict()
        """(tenant, interaction) -> the interaction's original expiry, from `verify` to `issue`
        (whose signature, fixed by its caller, carries no expiry)."""
        self.ttl_s = ttl_s

    def rekey(self, secret: bytes, now_unix: float | None = None) -> None:
        """Sign with `secret` from now on; tokens signed with the key it replaces still verify
        for one TTL (pods of one Deployment see a rotated Secret at different times), not for
        ever: rotating is how a leaked key is retired. `now_unix` defaults to the wall clock."""
        _check_secret(secret)
        if secret != self._secret:
            rotated = time.time() if now_unix is None else now_unix
            self._previous, self._secret = self._secret, secret
            self._previous_until = rotated + self.ttl_s + CLOCK_SKEW_S

    def _sign(self, payload: bytes, secret: bytes | None = None) -> str:
        key = self._secret if secret is None else secret
        return _b64(hmac.digest(key, payload, "sha256"))

    def _signed(self, payload: bytes, signature: str) -> _Key | None:
        """Which key, current or previous, signed `payload` with `signature`; None if neither."""
        # Compare bytes: compare_digest refuses non-ASCII str, and headers can carry anything.
        given = signature.encode("utf-8", "replace")
        if hmac.compare_digest(self._sign(payload).encode(), given):
            return _Key.CURRENT
        previous = self._previous
        if previous is not None and hmac.compare_digest(
            self._sign(payload, previous).encode(), given
        ):
            return _Key.PREVIOUS
        return None

    def _remember(self, tenant: str, interaction: str, expiry: int, now_unix: float) -> None:
        """Keep a verified token's expiry for the `issue` of the same call (bounded, see
        `MAX_REMEMBERED_INTERACTIONS`); the oldest and the expired entries go first."""
        expiries = self._expiries
        key = (tenant, interaction)
        expiries[key] = expiry
        expiries.move_to_end(key)
        while expiries and (
            len(expiries) > MAX_REMEMBERED_INTERACTIONS or next(iter(expiries.values())) < now_unix
        ):
            expiries.popitem(last=False)

    def issue(self, tenant: str, interaction: str, now_unix: float) -> str:
        """A token for `interaction` of `tenant`. It keeps the expiry of the token `verify` last
        accepted for the interaction (its first call's); an interaction `verify` has not seen (a
        new one) expires one TTL from now. The original expiry travels in the token, so another
        pod or a restarted one keeps it too; only an interaction this map dropped between its
        `verify` and its `issue` (over `MAX_REMEMBERED_INTERACTIONS` calls apart) would get a
        fresh TTL."""
        expiry = self._expiries.get((tenant, interaction))
        if expiry is None or expiry < now_unix:
            expiry = int(now_unix + self.ttl_s)
        payload = _COMPACT_JSON.encode({"t": tenant, "i": interaction, "e": expiry}).encode()
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
        signer = self._signed(payload, signature)
        if signer is None:
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
        if expiry > now_unix + self.ttl_s + CLOCK_SKEW_S:
            return None  # no sidecar with this TTL issued it: minted with a leaked key, say
        if signer is _Key.PREVIOUS and expiry > self._previous_until:
            return None  # the retired key signed nothing expiring this late
        self._remember(tenant, interaction, expiry, now_unix)
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


def scheduling_tier(requested: Tier | None, configured: Tier) -> Tier:
    """The tier a request is scheduled in: the tenant's configured tier, or the header's.

    The header may claim at most `iw-n`, or the configured tier if that is higher: `iw-f` is
    the tenant's configuration to give, or any client would jump every other tenant's queue
    under FCFS with the priority, EDF or DPA ordering. `iw-n` stays open to every tenant because
    the batch service promotes a `niw` tenant's late items with it (their completion window is
    running out), and `iw-n` is where ordinary interactive work waits anyway."""
    if requested is None:
        return configured
    ceiling = min(TIER_RANK[configured], TIER_RANK[Tier.IW_NORMAL])
    return configured if TIER_RANK[requested] < ceiling else requested


def scheduling_deadline_ms(requested_ms: float | None, ttft_s: float | None) -> float | None:
    """Milliseconds from arrival to the request's first-token deadline: the header's, but never
    earlier than the tier's TTFT target (an earlier one would jump the EDF/DPA queue); the target
    itself without a header. A tier without a target has no deadline, header or not."""
    if ttft_s is None:
        return None
    target_ms = ttft_s * 1000.0
    return target_ms if requested_ms is None else max(requested_ms, target_ms)


def _checked_name(value: str, what: str, header: str) -> str:
    if not _NAME.match(value):
        raise ApiError(
            400,
            f"invalid {what} {value[:64]!r}: 1-128 characters of letters, digits and ._:@/+-",
            code="invalid_header",
            param=header,
        )
    return value


def _single(headers: Mapping[str, str], name: str) -> str | None:
    """The one value of header `name`, or None; 400 `invalid_header` when it is repeated (which
    value a gateway meant is unknowable, and an appending gateway puts the client's first)."""
    if not isinstance(headers, MultiMapping):
        return headers.get(name)  # a plain mapping cannot repeat a key
    values: list[str] = headers.getall(name, [])
    if len(values) > 1:
        raise ApiError(
            400,
            f"header {name} appears {len(values)} times: send it once",
            code="invalid_header",
            param=name,
        )
    return values[0] if values else None


def resolve_identity(
    headers: Mapping[str, str],
    body_user: object,
    *,
    tenant_header: str,
    tokens: InteractionTokens,
    now_unix: float,
) -> Identity:
    """Read the caller's identity from headers and body; raises ApiError(400) on bad or
    repeated values."""
    raw_tenant = _single(headers, tenant_header)
    if raw_tenant:
        tenant = _checked_name(raw_tenant, "tenant", tenant_header)
    elif isinstance(body_user, str) and body_user:
        tenant = _checked_name(body_user, "user", "user")
    else:
        tenant = DEFAULT_TENANT
    app_value = _single(headers, APP_HEADER)
    app = _checked_name(app_value, "application", APP_HEADER) if app_value else None
    tier: Tier | None = None
    if tier_value := _single(headers, TIER_HEADER):
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
    if deadline_value := _single(headers, DEADLINE_HEADER):
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
    stage_value = _single(headers, STAGE_HEADER)
    stage = _checked_name(stage_value, "stage", STAGE_HEADER) if stage_value else None
    interaction: str | None = None
    if token := _single(headers, INTERACTION_HEADER):
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
