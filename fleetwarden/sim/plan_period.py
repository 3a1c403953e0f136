"""The simulator's planning period, derived from the fleet as the operator derives it.

The operator plans the whole fleet every `period_of(specs)` seconds (operator/hourly_planner.py):
the shortest `scaling.forecast.horizonSeconds` over its ModelDeployments, so every model gets a
plan at least that often, and each plan carries that period to the scalers (LT-UA's last window
is the last `lastWindowMinutes` of it). A simulator that planned every hour regardless would
answer for a different operator whenever a ModelDeployment sets a shorter horizon. The rule is
restated here because the simulator may not import the operator (import-linter layers); a test
holds the two to the same answer.
"""

from __future__ import annotations

from fleetwarden.sim.fleet_spec import Fleet

DEFAULT_PERIOD_S = 3600.0
"""The period of a fleet without ModelDeployments (the operator's `DEFAULT_PERIOD_S`)."""


def plan_period_s(fleet: Fleet) -> float:
    """Seconds between two planning rounds for `fleet`: its shortest `horizonSeconds`."""
    horizons = [m.spec.scaling.forecast.horizon_seconds for m in fleet.models.values()]
    return float(min(horizons)) if horizons else DEFAULT_PERIOD_S
