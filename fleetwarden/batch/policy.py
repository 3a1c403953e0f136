"""The dispatcher's decisions as pure functions: how many items to release, at which tier, and
what to do with an engine's answer (commit it, or retry after a backoff).

Nothing here reads a clock or does I/O; the dispatcher passes `now` and the facts in, so tests pin
every branch with plain values.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from enum import StrEnum

from fleetwarden.api.enums import Tier
from fleetwarden.batch.records import ClaimedItem, ItemResult, Settlement
from fleetwarden.batch.results import error_line, response_line, usage_tokens
from fleetwarden.scaling.niw_release import ReleaseRule

TIER_HEADER = "x-fleetwarden-tier"
"""Header that tells the scheduler sidecar the item's tier: `niw`, or `iw-n` once promoted."""
TENANT_HEADER = "x-fleetwarden-tenant"
"""Default header carrying the batch's tenant: the sidecar's default trusted tenant header. A
target whose sidecar trusts another (`spec.sidecar.tenantHeader`) names it in its config's
`tenant_header`, or the sidecar counts and schedules every item as tenant `default`."""
ITEM_HEADER = "x-fleetwarden-batch-item"
"""Header `<batch_id>/<custom_id, percent-encoded>`: correlates retries of one item (custom_ids
may hold any character, headers may not)."""
RESERVED_HEADERS = frozenset(
    {
        TIER_HEADER,
        ITEM_HEADER,
        "authorization",
        "host",
        "content-type",
        "content-length",
        "transfer-encoding",
        "connection",
    }
)
"""Headers the engine client sets for its own purposes (tier, item, the target's bearer token)
or that frame the request: a tenant header of one of these names would overwrite it, or be
overwritten, so it is refused."""
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")
"""An HTTP field name (RFC 9110 `token`), at most as long as the CRD's `tenantHeader`."""


def tenant_header_problem(name: str) -> str | None:
    """Why `name` cannot carry the tenant to a target, or None if it can.

    A name that is not an HTTP token cannot be sent at all, and a reserved one collides with a
    header the request needs; either way the tenant would not arrive, so the config refuses it.
    """
    if not _HEADER_NAME.fullmatch(name):
        allowed = "1-128 letters, digits and !#$%&'*+-.^_`|~"
        return f"{name[:64]!r} is not an HTTP header name ({allowed})"
    if name.lower() in RESERVED_HEADERS:
        return f"{name!r} is a header the batch service already sends or HTTP needs"
    return None


class TargetKind(StrEnum):
    """Where items go. A spot target is just another kind with its own release plan."""

    SHARED = "shared"
    """A serving region shared with interactive traffic: release follows utilisation."""
    SPOT = "spot"
    """A Deployment on spot nodes that runs only NIW work: release fills its free slots."""


@dataclass(frozen=True, slots=True)
class ReleasePlan:
    """What one capacity signal lets the dispatcher claim from a queue.

    Promoted items (past the rule's promotion age for their completion window,
    `ReleaseRule.promotion_age_s`) are claimed first, oldest first, up to `promoted`; then up to
    `by_deadline` items in deadline order; never more than `limit`.
    """

    by_deadline: int
    promoted: int
    limit: int


def fresh_reading(read_at: float, max_age_s: float, last_release_at: float | None) -> bool:
    """Whether a utilisation reading can already show the work released last time.

    A reading taken at `read_at` from a source whose data may be up to `max_age_s` old (a
    Prometheus scrape interval; 0 for an engine read live) reflects the region at `read_at -
    max_age_s` at the earliest. Only if that is not before `last_release_at` (the last signal
    that released anything; None: never) can the items released then be part of it. Acting on
    an older reading again would release on capacity those items are already taking: at a 1 s
    signal and a 30 s scrape, one low reading would fill every in-flight slot before the first
    released item shows up in utilisation.
    """
    return last_release_at is None or read_at - max(0.0, max_age_s) >= last_release_at


def release_plan(
    kind: TargetKind,
    rule: ReleaseRule,
    utilisation: float | None,
    free_slots: int,
    fresh: bool = True,
) -> ReleasePlan:
    """The plan for one signal from a target with `free_slots` unused in-flight slots.

    Shared targets release what SageServe's rule allows (0, 1 or 2), but only on a `fresh`
    reading (see `fresh_reading`): the rule's count is spent once per reading, not once per
    poll of the same reading. Promoted items go regardless of utilisation and freshness: they
    travel at interactive priority like any interactive request (the point of promotion is
    that a permanently busy region still meets deadlines). Spot targets run NIW work only, so
    every free slot is filled.
    """
    free = max(0, free_slots)
    if kind is TargetKind.SPOT:
        return ReleasePlan(by_deadline=free, promoted=0, limit=free)
    count = rule.release_count(utilisation) if fresh else 0
    return ReleasePlan(by_deadline=min(free, count), promoted=free, limit=free)


def tier_for(
    rule: ReleaseRule, created_at: float, now: float, deadline: float | None = None
) -> Tier:
    """The tier an item is sent with: NIW, or interactive-normal once promoted.

    Promotion depends on the item's completion window (`deadline - created_at`, see
    `ReleaseRule.promotion_age_s`); without a deadline only the age bound applies.
    """
    window = math.inf if deadline is None else deadline - created_at
    return Tier.IW_NORMAL if rule.promoted(now - created_at, window) else Tier.NIW


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries of engine errors: exponential backoff with bounded, deterministic jitter."""

    max_attempts: int = 5
    """Dispatches per item, the first included; then the last error goes to the error file."""
    base_delay_s: float = 1.0
    """Delay after the first failure; doubles per attempt."""
    max_delay_s: float = 300.0
    """Cap on one delay (an engine's Retry-After is honoured up to this too)."""
    jitter: float = 0.2
    """Fraction of the delay spread per item, so items failed together do not return together."""
    max_interruptions: int = 3
    """Mid-request interruptions of one item (`EngineFailure.mid_request`) that do not count as
    attempts; past them each one counts, so an item that takes its engine down every time it
    runs ends in the error file after `max_attempts` more, instead of crashing engines until its
    batch expires. Refused connections and draining answers are always free: the request never
    reached an engine, which may take minutes to come back."""


RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})
"""Client-class statuses that mean "not now" rather than "never"; every 5xx also retries."""


def backoff_s(policy: RetryPolicy, attempt: int, key: str, retry_after_s: float | None) -> float:
    """Delay before dispatching again after failed attempt number `attempt` (1-based).

    The jitter is derived from `key` (the item) and the attempt, not from a random source, so
    the same inputs always give the same delay.
    """
    delay = min(policy.max_delay_s, policy.base_delay_s * (2.0 ** max(0, attempt - 1)))
    digest = hashlib.sha256(f"{key}:{attempt}".encode()).digest()
    spread = (int.from_bytes(digest[:8], "big") / 2**64) * 2.0 - 1.0  # [-1, 1)
    delay *= 1.0 + policy.jitter * spread
    if retry_after_s is not None and retry_after_s > delay:
        delay = min(policy.max_delay_s, retry_after_s)
    return max(0.0, delay)


@dataclass(frozen=True, slots=True)
class EngineReply:
    """An HTTP answer from a target."""

    status: int
    body: bytes
    request_id: str
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class EngineFailure:
    """No HTTP answer: connection refused or reset (an evicted spot pod), or a timeout."""

    message: str
    interrupted: bool = False
    """The target went away (refused, reset, closed mid-answer), not the request failing: a
    timeout is not an interruption, since a request that is too big for the engine times out
    every time and must end in the error file."""
    mid_request: bool = False
    """The connection dropped while the engine had the request (reset, closed, cut off), as
    opposed to refused before it got there: only then can the item be what took the engine down,
    so only these count towards `RetryPolicy.max_interruptions`."""


DRAINING_CODES = frozenset({"engine_not_ready", "draining"})
"""`error.code` of a 503 from a pod that is starting or shutting down (the fleetwarden sidecar
answers `engine_not_ready` while its engine is not serving): an interruption, not a failure."""


def interrupted(outcome: EngineReply | EngineFailure) -> bool:
    """Whether an attempt was cut short by the target rather than failed by the item.

    Spot capacity is reclaimed with a short notice and serving pods drain on every rollout; an
    item caught in that must not use up its retries, or a few evictions would send healthy work
    to the error file. The batch's completion window still bounds how long it can keep trying.
    """
    if isinstance(outcome, EngineFailure):
        return outcome.interrupted
    if outcome.status != 503:
        return False
    try:
        body = json.loads(outcome.body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and error.get("code") in DRAINING_CODES


def settle(
    item: ClaimedItem,
    outcome: EngineReply | EngineFailure,
    policy: RetryPolicy,
    now: float,
    interruptions: int = 0,
) -> Settlement:
    """Turn one dispatch attempt into what the store commits.

    An interrupted attempt (see `interrupted`) goes back to the queue without counting, unless
    `interruptions` (this item's, this one included) exceeds `policy.max_interruptions`: then it
    counts like any other failure.
    2xx with a JSON body goes to the output file. A reply that retrying cannot fix (most 4xx)
    goes to the error file at once. Retryable failures wait `backoff_s` and go back to the
    queue until `max_attempts` dispatches have failed; then the last failure is the result.
    """
    if interrupted(outcome) and interruptions <= policy.max_interruptions:
        # Back soon, at the base delay: another replica (or the shared capacity) can take it.
        delay = min(policy.base_delay_s, policy.max_delay_s)
        return Settlement(item, retry_at=now + delay, refund=True)
    body: object = None
    if isinstance(outcome, EngineReply):
        try:
            body = json.loads(outcome.body) if outcome.body else None
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            # RecursionError: absurdly deep JSON. Raising here would strand the item, leased
            # and unsettled, to run again on every lease expiry; as "not JSON" it is reported.
            body = None
        if 200 <= outcome.status < 300 and isinstance(body, dict):
            tokens_in, tokens_out = usage_tokens(body)
            line = response_line(
                item.batch_id, item.idx, item.custom_id, outcome.status, outcome.request_id, body
            )
            return Settlement(item, ItemResult(True, line, tokens_in, tokens_out))
        retryable = (
            outcome.status >= 500
            or outcome.status in RETRYABLE_STATUSES
            or 200 <= outcome.status < 300
        )
    else:
        retryable = True
    if retryable and item.attempts < policy.max_attempts:
        retry_after = outcome.retry_after_s if isinstance(outcome, EngineReply) else None
        delay = backoff_s(policy, item.attempts, item.member, retry_after)
        return Settlement(item, retry_at=now + delay)
    if isinstance(outcome, EngineFailure):
        line = error_line(
            item.batch_id,
            item.idx,
            item.custom_id,
            "engine_unavailable",
            f"no answer after {item.attempts} attempts: {outcome.message}"
            + (
                f" (interrupted {interruptions} times: the engine went away each time it ran)"
                if interruptions > policy.max_interruptions
                else ""
            ),
        )
    elif 200 <= outcome.status < 300:
        line = error_line(
            item.batch_id,
            item.idx,
            item.custom_id,
            "invalid_engine_response",
            f"the engine answered {outcome.status} without a JSON object body",
        )
    else:
        if body is None:
            body = {"error": {"message": outcome.body.decode("utf-8", "replace")[:2000]}}
        line = response_line(
            item.batch_id, item.idx, item.custom_id, outcome.status, outcome.request_id, body
        )
    return Settlement(item, ItemResult(False, line))
