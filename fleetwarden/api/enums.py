"""The shared vocabulary: one enum per choice a user makes.

The same enum values appear in the CRD schemas, the sidecar's fairness config, the CLI and the
simulator, so a policy name typed in a TenantPolicy is exactly the name the scheduler factory keys on.
Values are the lower-case, hyphenated strings users write in YAML.
"""

from __future__ import annotations

from enum import StrEnum


class PolicyName(StrEnum):
    """Which scheduler orders requests across tenants inside every serving pod."""

    FCFS = "fcfs"
    """First come, first served: the baseline."""
    LCF = "lcf"
    """Least counter first: VTC without the counter lift (a negative control, not for production)."""
    VTC = "vtc"
    """Virtual Token Counter (Sheng et al., OSDI'24), weighted by tenant weight."""
    WSC = "wsc"
    """FairServe's weighted service counter, normalised per application and interaction stage."""
    DRR = "drr"
    """Deficit round robin over tenants, inside strict tier bands."""


class Ordering(StrEnum):
    """How requests of one tenant are ordered (or all requests, under `fcfs`)."""

    FIFO = "fifo"
    PRIORITY = "priority"
    """Tier first (iw-f before iw-n before niw), then arrival."""
    EDF = "edf"
    """Earliest deadline first; expired requests first to prevent starvation."""
    DPA = "dpa"
    """SageServe's deadline-and-priority-aware ordering (section 6.5)."""


class Tier(StrEnum):
    """Service tier of a request (SageServe section 3)."""

    IW_FAST = "iw-f"
    """Interactive, fast: the tightest time-to-first-token target."""
    IW_NORMAL = "iw-n"
    """Interactive, normal."""
    NIW = "niw"
    """Non-interactive: batch work with a deadline in hours."""


class ScalingStrategy(StrEnum):
    """How replicas move between hourly plans (SageServe section 6.4)."""

    REACTIVE = "reactive"
    LT_I = "lt-i"
    LT_U = "lt-u"
    LT_UA = "lt-ua"


class QuantumUnit(StrEnum):
    """What a deficit-round-robin quantum counts."""

    TOKENS = "tokens"
    REQUESTS = "requests"


class LengthPrediction(StrEnum):
    """How VTC predicts a request's output length to charge it at dispatch."""

    NONE = "none"
    MOVING_AVERAGE = "moving-average"
