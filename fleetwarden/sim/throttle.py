"""A pod's rate limits in the simulator: the sidecar's RPM/TPM limiter or FairServe's OIT.

Each serving pod's sidecar enforces the TenantPolicy's limits on the requests it receives, so the
simulator keeps one limiter per instance, built from the same `FairnessConfig` with the same
classes (`RateLimiter.from_config`, `OverloadInteractionThrottle`). Under OIT the pod counts as
overloaded when its KV usage reaches the policy's threshold or requests are queued in it (the
sidecar's gate is full), as `fleetwarden replay` judges it. Output tokens enter TPM windows when
the request completes (the sidecar adds them as they stream; within a one-minute window the
difference is the request's own duration). Early rejection is not simulated.
"""

from __future__ import annotations

from typing import Protocol

from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.limits import OverloadInteractionThrottle, RateLimiter, is_overloaded
from fleetwarden.fairness.request import Request


def has_limits(config: FairnessConfig) -> bool:
    """Whether any tenant, the defaults or any application has an RPM or TPM limit. A limit is
    set when it is not None: a limit of 0 (if a config ever carries one) still refuses, so
    testing truthiness would skip a limiter that has something to enforce."""
    limits = [config.defaults, *config.tenants.values()]
    apps = config.applications.values()
    return any(t.rpm is not None or t.tpm is not None for t in limits) or any(
        a.rpm is not None or a.tpm is not None for a in apps
    )


class Pod(Protocol):
    """What the throttle reads of its pod, only when OIT's overload test needs it."""

    def utilisation(self, t: float) -> float:
        """KV utilisation at `t`."""
        ...

    def backlogged(self) -> bool:
        """Whether requests wait in the pod (the sidecar's gate is full)."""
        ...


class PodThrottle:
    """The limiter of one pod; `refuse` is the sidecar's `offer` minus queue bounds.

    Two shortcuts keep the simulator's hot path cheap without changing any decision: the pod's
    backlog and KV utilisation are read only when OIT would read them (a new interaction; the
    utilisation only with an empty gate), and output tokens skip the limiter when neither the tenant nor the application has a TPM
    limit (the limiter would add them to no window)."""

    __slots__ = ("_limiter", "_oit", "_threshold", "_tpm")

    def __init__(self, config: FairnessConfig) -> None:
        self._limiter = RateLimiter.from_config(config)
        self._oit = (
            OverloadInteractionThrottle(self._limiter) if config.interaction_throttling else None
        )
        self._threshold = config.overload_kv_utilization
        self._tpm: dict[tuple[str, str | None], bool] = {}
        """Per (tenant, application): whether any TPM window counts its tokens."""

    def refuse(self, request: Request, now: float, pod: Pod) -> bool:
        """Whether the request is answered 429 (refused requests record nothing). The `pod` is
        asked about only if the overload test needs it (the router calls this for every request)."""
        if self._oit is not None:
            if request.continuation:
                overloaded = True  # not read for a continuation: OIT never throttles those
            else:
                gate_full = pod.backlogged()
                utilisation = None if gate_full else pod.utilisation(now)
                overloaded = is_overloaded(utilisation, self._threshold, gate_full=gate_full)
            decision = self._oit.check(
                request.tenant,
                request.app,
                request.input_tokens,
                now,
                overloaded=overloaded,
                continuation=request.continuation,
            )
            return not decision.allowed
        return not self._limiter.admit(
            request.tenant, request.app, request.input_tokens, now
        ).allowed

    def output_tokens(self, request: Request, tokens: int, now: float) -> None:
        key = (request.tenant, request.app)
        counted = self._tpm.get(key)
        if counted is None:
            limiter = self._limiter
            counted = limiter.tenant_limits(key[0]).tpm is not None or (
                key[1] is not None and limiter.app_limits(key[1]).tpm is not None
            )
            self._tpm[key] = counted
        if counted:
            self._limiter.record_tokens(request.tenant, request.app, tokens, now)
