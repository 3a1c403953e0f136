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

from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.limits import OverloadInteractionThrottle, RateLimiter, is_overloaded
from fleetwarden.fairness.request import Request


def has_limits(config: FairnessConfig) -> bool:
    """Whether any tenant, the defaults or any application has an RPM or TPM limit."""
    limits = [config.defaults, *config.tenants.values()]
    apps = config.applications.values()
    return any(t.rpm or t.tpm for t in limits) or any(a.rpm or a.tpm for a in apps)


class PodThrottle:
    """The limiter of one pod; `refuse` is the sidecar's `offer` minus queue bounds."""

    __slots__ = ("_limiter", "_oit", "_threshold")

    def __init__(self, config: FairnessConfig) -> None:
        self._limiter = RateLimiter.from_config(config)
        self._oit = (
            OverloadInteractionThrottle(self._limiter) if config.interaction_throttling else None
        )
        self._threshold = config.overload_kv_utilization

    def refuse(self, request: Request, now: float, kv_utilisation: float, queued: int) -> bool:
        """Whether the request is answered 429 (refused requests record nothing)."""
        if self._oit is not None:
            overloaded = is_overloaded(kv_utilisation, self._threshold, gate_full=queued > 0)
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
        self._limiter.record_tokens(request.tenant, request.app, tokens, now)
