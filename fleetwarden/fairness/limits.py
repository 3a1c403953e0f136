"""Per-tenant and per-application RPM/TPM limits, and FairServe's Overload and Interaction-driven
Throttling (OIT): the same limits, enforced only under overload and never mid-interaction.

Windows are exact sliding windows: an event at ``e`` counts at ``now`` iff
``now - window_s < e <= now``. Times are integer microseconds internally, which makes
``retry_after_s`` exact: waiting it makes the same check pass, one microsecond less does not.
At epoch-scale times floats are a quarter microsecond apart and ``now + wait`` rounds, so the
wait is then not always a whole number of microseconds (`_wait_s`), but it still passes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from fleetwarden.fairness.config import FairnessConfig

DEFAULT_WINDOW_S = 60.0
US_PER_S = 1_000_000


def _to_us(seconds: float) -> int:
    return round(seconds * US_PER_S)


def _wait_s(now_s: float, target_us: int) -> float:
    """A wait after which a check at ``now_s + wait`` (added in floats, as a caller adds it)
    sees time `target_us` or later. Below 2^51 us (the year 2041) a microsecond less does not
    when `now_s` is a whole number of microseconds; an arbitrary float `now_s` can make the wait
    up to a microsecond longer than the least.

    It is the whole number of microseconds, ``(target_us - now_us) / 1e6``, when that works, as
    it nearly always does. That count can fall 1 us short: `now_s` may lie up to half a
    microsecond from the microsecond it rounds to, and at epoch-scale times (1.7e9 s) floats are
    about 0.24 us apart, so the sum rounds (a review found it short in about 1% of refusals
    there, and the retry was refused again). Then the wait is the float nearest the target time
    minus `now_s` (their sum is that float exactly while the wait is at most `now_s`), moved up
    by one float step of the sum at a time while even that rounds short, as it can above 2^51 us.
    """
    now_us = round(now_s * US_PER_S)
    wait = (target_us - now_us) / US_PER_S
    if round((now_s + wait) * US_PER_S) >= target_us:
        return wait
    wait = max(0.0, target_us / US_PER_S - now_s)
    while round((now_s + wait) * US_PER_S) < target_us:
        # One float step of the sum: exact while wait <= now_s (Sterbenz); otherwise a step of
        # `wait` is at least half a step of the sum. `wait` grows each time, the sum every step
        # or two, so this ends within a few steps of where it started.
        step = math.nextafter(now_s + wait, math.inf) - now_s
        wait = max(math.nextafter(wait, math.inf), step)
    return wait


class SlidingWindowCounter:
    """Exact sum of weighted events over the last `window_s` seconds.

    A deque of (time, amount) plus a running sum; each call first drops events that left the
    window, so `add` and `total` are amortised O(1). Time never runs backwards here: a `now`
    earlier than the latest seen is taken as the latest (the sidecar's coroutines may stamp events
    slightly out of order, and counting one a few microseconds longer is the conservative choice).
    """

    __slots__ = ("_events", "_latest_us", "_sum", "_window_us")

    def __init__(self, window_s: float = DEFAULT_WINDOW_S) -> None:
        self._window_us = _to_us(window_s)
        if self._window_us <= 0:
            raise ValueError(f"window must be at least 1 us, got {window_s} s")
        self._events: deque[tuple[int, int]] = deque()
        self._sum = 0
        self._latest_us: int | None = None

    def _advance(self, now_s: float) -> int:
        now_us = round(now_s * US_PER_S)  # `_to_us`, inlined: this runs for every request
        if self._latest_us is not None and now_us < self._latest_us:
            now_us = self._latest_us
        self._latest_us = now_us
        horizon_us = now_us - self._window_us
        events = self._events
        while events and events[0][0] <= horizon_us:
            self._sum -= events.popleft()[1]
        return now_us

    def add(self, amount: int, now_s: float) -> None:
        """Record `amount` (1 for a request, a token count for TPM) at `now_s`."""
        if amount < 0:
            raise ValueError(f"amount must be >= 0, got {amount}")
        now_us = self._advance(now_s)
        if amount:
            self._events.append((now_us, amount))
            self._sum += amount

    def total(self, now_s: float) -> int:
        """Sum of the amounts recorded in the window ending at `now_s`."""
        self._advance(now_s)
        return self._sum

    def retry_after_s(self, amount: int, limit: int, now_s: float) -> float:
        """Seconds until `amount` more fits under `limit` (0.0: fits now; inf: never), i.e. until
        the newest of the oldest events that must expire leaves. Linear in those events.

        Counted from `now_s` as given, so that ``now_s + retry_after_s`` passes even when `now_s`
        is earlier than the latest time seen (which the window uses in its place)."""
        self._advance(now_s)
        events = self._events
        excess = self._sum + amount - limit
        if excess <= 0 or amount > limit:
            return 0.0 if excess <= 0 else math.inf
        for event_us, event_amount in events:
            excess -= event_amount
            if excess <= 0:
                return _wait_s(now_s, event_us + self._window_us)
        raise AssertionError("unreachable: the whole window expiring always makes room")


@dataclass(frozen=True)
class Limits:
    """Requests and tokens per window for one tenant or application; None means unlimited.

    0 is a limit no request fits (`check` refuses with `retry_after_s` inf), kept for direct
    callers such as `fleetwarden replay --rpm 0`, which counts every request throttled. A sidecar
    never sees it: the TenantPolicy CRD and the rendered `FairnessConfig` refuse 0 (`RateLimit`),
    since its 429s would be retried forever."""

    rpm: int | None = None
    tpm: int | None = None

    def __post_init__(self) -> None:
        for name, value in (("rpm", self.rpm), ("tpm", self.tpm)):
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {value}")

    @classmethod
    def of(cls, value: Limits | Mapping[str, int | None]) -> Limits:
        """Accept a `Limits` or a plain dict such as ``{"rpm": 10, "tpm": None}``."""
        if isinstance(value, Limits):
            return value
        return cls(rpm=value.get("rpm"), tpm=value.get("tpm"))


LimitsLike = Limits | Mapping[str, int | None]


class ThrottleReason(StrEnum):
    """Which limit refused a request; equal to its plain string, e.g. ``"tenant-rpm"``."""

    TENANT_RPM = "tenant-rpm"
    TENANT_TPM = "tenant-tpm"
    APP_RPM = "app-rpm"
    APP_TPM = "app-tpm"


@dataclass(frozen=True)
class Decision:
    """Whether a request may proceed, which limit refused it first, and when a retry will pass.

    `retry_after_s` is the wait after which every limit this request violates has room again (the
    maximum over them, not just the reported one), assuming nothing else is recorded meanwhile;
    inf if a single request exceeds a limit by itself.
    """

    allowed: bool
    reason: ThrottleReason | None = None
    retry_after_s: float = 0.0


ALLOWED = Decision(allowed=True)
PRUNE_EVERY = 50_000
"""Records between two automatic `RateLimiter.prune` calls (amortised: a prune is linear in the
windows, at most a few per record)."""
UNLIMITED = Limits()

_Dimension = tuple[ThrottleReason, str, int, int]  # reason, tenant or app, limit, amount added
_Limited = tuple[ThrottleReason, tuple[ThrottleReason, str], int, bool]
"""A limited dimension: reason, its window's key, the limit, and whether it counts requests
(RPM) rather than tokens (TPM)."""
_RPM = (ThrottleReason.TENANT_RPM, ThrottleReason.APP_RPM)


class RateLimiter:
    """Per-tenant (user) and per-application RPM and TPM limits over sliding windows.

    Unknown tenants get `default`; unknown applications (and app None) are unlimited. Only limited
    dimensions keep a window. `check` never records: a refused request must not use up quota, or
    a client retrying while throttled would keep its own window full forever.
    """

    def __init__(
        self,
        tenants: Mapping[str, LimitsLike] | None = None,
        default: LimitsLike | None = None,
        applications: Mapping[str, LimitsLike] | None = None,
        *,
        window_s: float = DEFAULT_WINDOW_S,
    ) -> None:
        self._tenants = {k: Limits.of(v) for k, v in (tenants or {}).items()}
        self._default = Limits.of(default) if default is not None else Limits()
        self._apps = {k: Limits.of(v) for k, v in (applications or {}).items()}
        self._window_s = window_s
        self._window_us = _to_us(window_s)
        """The window in microseconds; not validated here, as before: a window under 1 us fails
        when a window is first built (`SlidingWindowCounter` raises)."""
        self._windows: dict[tuple[ThrottleReason, str], SlidingWindowCounter] = {}
        self._records = 0
        """Records since the last `prune`."""
        self._limited: dict[tuple[str, str | None], tuple[_Limited, ...]] = {}
        """The limited dimensions of each (tenant, app) seen: the limits never change, and every
        request asks twice (check, record), so the list is built once, not per request. Cleared
        by `prune`, so tenants seen once cost nothing forever."""

    @classmethod
    def from_config(
        cls, config: FairnessConfig, *, window_s: float = DEFAULT_WINDOW_S
    ) -> RateLimiter:
        """Limits of the sidecar's config: tenants, defaults for unknown tenants, applications."""
        return cls(
            {name: Limits(t.rpm, t.tpm) for name, t in config.tenants.items()},
            Limits(config.defaults.rpm, config.defaults.tpm),
            {name: Limits(a.rpm, a.tpm) for name, a in config.applications.items()},
            window_s=window_s,
        )

    def tenant_limits(self, tenant: str) -> Limits:
        return self._tenants.get(tenant, self._default)

    def app_limits(self, app: str) -> Limits:
        return self._apps.get(app, UNLIMITED)

    def _dimensions(
        self, tenant: str, app: str | None, requests: int, tokens: int
    ) -> list[_Dimension]:
        """The limited windows a request touches, in check order: user before application."""
        t = self.tenant_limits(tenant)
        candidates = [
            (ThrottleReason.TENANT_RPM, tenant, t.rpm, requests),
            (ThrottleReason.TENANT_TPM, tenant, t.tpm, tokens),
        ]
        if app is not None:
            a = self.app_limits(app)
            candidates += [
                (ThrottleReason.APP_RPM, app, a.rpm, requests),
                (ThrottleReason.APP_TPM, app, a.tpm, tokens),
            ]
        return [(r, k, limit, n) for r, k, limit, n in candidates if limit is not None]

    def _limited_dimensions(self, tenant: str, app: str | None) -> tuple[_Limited, ...]:
        """`_dimensions` without the amounts, memoised per (tenant, app)."""
        found = self._limited.get((tenant, app))
        if found is None:
            found = self._limited[tenant, app] = tuple(
                (reason, (reason, key), limit, reason in _RPM)
                for reason, key, limit, _ in self._dimensions(tenant, app, 1, 0)
            )
        return found

    def check(self, tenant: str, app: str | None, tokens: int, now: float) -> Decision:
        """Would this request fit? Tenant RPM, tenant TPM, then application RPM, application TPM.

        The user is checked before the application (FairServe 4.2), so a request over both limits
        reports the user's. `tokens` is what the request will be charged in TPM windows now.
        """
        found: list[tuple[ThrottleReason, float]] | None = None  # built only on a refusal
        windows = self._windows
        for reason, key, limit, per_request in self._limited_dimensions(tenant, app):
            amount = 1 if per_request else tokens
            window = windows.get(key)
            if window is not None:
                retry = window.retry_after_s(amount, limit, now)
            elif self._window_us > 0:  # an empty window's `retry_after_s`, without building one
                retry = 0.0 if amount <= limit else math.inf
            else:
                retry = SlidingWindowCounter(self._window_s).retry_after_s(amount, limit, now)
            if retry > 0.0:
                if found is None:
                    found = []
                found.append((reason, retry))
        if found is None:
            return ALLOWED
        return Decision(False, found[0][0], max(retry for _, retry in found))

    def _add(self, tenant: str, app: str | None, requests: int, tokens: int, now: float) -> None:
        windows = self._windows
        for _, key, _, per_request in self._limited_dimensions(tenant, app):
            amount = requests if per_request else tokens
            if amount:
                window = windows.get(key)
                if window is None:
                    window = windows[key] = SlidingWindowCounter(self._window_s)
                window.add(amount, now)

    def record(self, tenant: str, app: str | None, tokens: int, now: float) -> None:
        """Count an admitted request: one request and `tokens` tokens, for tenant and app.

        Every `PRUNE_EVERY` records the limiter prunes itself, so a stream of one-off tenants
        (the OpenAI `user` field may name every end user) cannot grow it without bound."""
        self._add(tenant, app, 1, tokens, now)
        self._records += 1
        if self._records >= PRUNE_EVERY:
            self.prune(now)

    def record_tokens(self, tenant: str, app: str | None, tokens: int, now: float) -> None:
        """Add tokens known only later (the output) to TPM windows, at the time they are known."""
        self._add(tenant, app, 0, tokens, now)

    def admit(self, tenant: str, app: str | None, tokens: int, now: float) -> Decision:
        """Plain rate limiting: check, and record if allowed. Throttles even on an idle engine."""
        decision = self.check(tenant, app, tokens, now)
        if decision.allowed:
            self.record(tenant, app, tokens, now)
        return decision

    def usage(self, tenant: str, app: str | None, now: float) -> dict[ThrottleReason, int]:
        """What each limited window of this tenant and application holds now (for metrics)."""
        windows = self._windows
        return {
            reason: windows[reason, key].total(now) if (reason, key) in windows else 0
            for reason, key, _, _ in self._dimensions(tenant, app, 0, 0)
        }

    def prune(self, now: float) -> int:
        """Drop windows with nothing left in them, so tenants seen once cost nothing forever."""
        empty = [key for key, window in self._windows.items() if window.total(now) == 0]
        for key in empty:
            del self._windows[key]
        self._limited.clear()
        self._records = 0
        return len(empty)


class OverloadInteractionThrottle:
    """FairServe's OIT: the limiter's user-then-application limits, enforced only under overload
    and only on requests that start a new interaction.

    Differences from plain RPM (`RateLimiter.admit`), which throttles whenever a window is full:

    * not overloaded: never throttles, whatever the windows say; an idle engine serving an
      over-limit user harms nobody, refusing wastes capacity (FairServe 3.4, 4.2);
    * a continuation (a later LLM call of an admitted interaction) is never throttled: refusing it
      wastes every token the interaction already consumed and leaves the user with no answer;
    * every request let through is recorded, idle-time ones and continuations too, so when
      overload begins the windows already hold each user's recent load.

    Unlike the paper (Algorithm 1 counts every arrival) a throttled request records nothing.
    `decide` only decides, for a caller that may still refuse the request for another reason
    (the scheduler's early rejection): only a request actually admitted may use up quota.
    """

    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter

    def decide(
        self,
        tenant: str,
        app: str | None,
        tokens: int,
        now: float,
        *,
        overloaded: bool,
        continuation: bool,
    ) -> Decision:
        """Whether the request may proceed; records nothing (the caller records on admission)."""
        if overloaded and not continuation:
            return self.limiter.check(tenant, app, tokens, now)
        return ALLOWED

    def check(
        self,
        tenant: str,
        app: str | None,
        tokens: int,
        now: float,
        *,
        overloaded: bool,
        continuation: bool,
    ) -> Decision:
        """`decide` and, when the request may proceed, record its arrival (for callers that
        admit whatever OIT lets through, like the simulator)."""
        decision = self.decide(
            tenant, app, tokens, now, overloaded=overloaded, continuation=continuation
        )
        if decision.allowed:
            self.limiter.record(tenant, app, tokens, now)
        return decision


def is_overloaded(kv_utilization: float | None, threshold: float, gate_full: bool) -> bool:
    """Whether OIT should enforce limits: the KV cache is at or over `threshold`, or the
    sidecar's own admission gate is full.

    Unknown telemetry (None, NaN: stale or failed scrape) alone is NOT overload. Dispatch treats it
    as saturated because holding a request is reversible; a throttle is not, the user gets an
    error. FairServe throttles only on evidence of overload, and without telemetry the evidence
    left is local: a full admission gate (waiting queue or in-flight token budget at its limit).
    """
    if gate_full:
        return True
    if kv_utilization is None or math.isnan(kv_utilization):
        return False
    return kv_utilization >= threshold
