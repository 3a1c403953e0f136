"""A dispatched request's life on the wire: what the metrics and the settlement need."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetwarden.fairness.fluidity import FluidityTracker
from fleetwarden.fairness.request import Request
from fleetwarden.sidecar.openai_request import ParsedCall


@dataclass
class Flight:
    """One scheduled request from dispatch to settlement."""

    request: Request
    call: ParsedCall
    tier: str
    arrival_s: float
    dispatched_s: float
    fluidity: FluidityTracker | None
    first_token_s: float | None = None
    last_token_s: float | None = None
    outcome: str = "served"
    usage: dict[str, Any] = field(default_factory=dict)
