"""The request as the scheduling core sees it, and the protocol every scheduling policy implements.

A policy is driven as a step function by its shell (the sidecar's dispatcher, the simulator's
engine model), always with the current time passed in:

    push(request, now)              a request arrives (after any throttling)
    peek(now) -> request | None     what the policy would dispatch next
    pop(now) -> request | None      dispatch it: the capacity gate has admitted the head
    charge(request, input_tokens=, output_tokens=, now=)   service delivered (per token event)
    complete(request, now)          the request finished (or was cancelled while running)
    remove(request) -> bool         a queued request was cancelled before dispatch

Input tokens are charged by the policy itself at dispatch (`pop`), as VTC's Algorithm 2 does, so
that a burst of selections in one step sees the counters move; `charge(input_tokens=...)` is for
corrections (the sidecar estimates prompt tokens before dispatch and reconciles with the engine's
usage). Ties are always broken by the arrival sequence number, never by object identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from fleetwarden.api.enums import Tier

TIER_RANK = {Tier.IW_FAST: 0, Tier.IW_NORMAL: 1, Tier.NIW: 2}
"""Strict priority of tiers: lower ranks go first."""


@dataclass(eq=False, slots=True)
class Request:
    """One inference request. Mutable only in its accounting fields; identity is `seq`."""

    seq: int
    """Arrival sequence number, unique per scheduler: the only tie-breaker."""
    tenant: str
    arrival_s: float
    input_tokens: int
    """Prompt tokens, system prompt included."""
    max_output_tokens: int
    """The output budget (OpenAI `max_tokens`): what the capacity gate must reserve at worst."""
    system_tokens: int = 0
    """Part of `input_tokens` that is system prompt (FairServe weighs it separately)."""
    app: str | None = None
    interaction: str | None = None
    stage: str | None = None
    continuation: bool = False
    """Continues an interaction already in flight (FairServe serves these first, never throttles)."""
    tier: Tier = Tier.IW_NORMAL
    deadline_s: float | None = None
    """Absolute time by which the first token is due; None means no deadline."""
    predicted_output_tokens: int | None = None
    """Set by the shell when a length prediction is available (oracle or estimate)."""
    output_tokens: int = 0
    """Generated so far; maintained by the shell that runs the request."""

    @property
    def user_input_tokens(self) -> int:
        return self.input_tokens - self.system_tokens

    @property
    def tier_rank(self) -> int:
        return TIER_RANK[self.tier]


class SchedulingPolicy(Protocol):
    """What every policy offers its shell (see the module docstring for the calling protocol)."""

    def push(self, request: Request, now: float) -> None: ...

    def peek(self, now: float) -> Request | None: ...

    def pop(self, now: float) -> Request | None: ...

    def charge(
        self, request: Request, *, input_tokens: int = 0, output_tokens: int = 0, now: float
    ) -> None: ...

    def complete(self, request: Request, now: float) -> None: ...

    def remove(self, request: Request) -> bool: ...

    def __len__(self) -> int: ...
