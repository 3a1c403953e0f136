"""Spot sizing, re-exported where the batch service's first version defined it.

The function lives in `fleetwarden.scaling.spot`, a pure core both the batch service and the
operator may import (the operator may not import the batch package).
"""

from __future__ import annotations

from fleetwarden.scaling.spot import SpotDecision, SpotDemand, SpotSizing, spot_replicas

__all__ = ["SpotDecision", "SpotDemand", "SpotSizing", "spot_replicas"]
