"""fleetwarden.scaling: pure scaling decisions (SageServe section 6.4) and the NIW release rule.

Nothing here reads a clock or does I/O (an import-linter contract enforces it): the operator's
scaling timer and the simulator's tick pass the time and the facts in and apply the answer.
"""

from fleetwarden.scaling.config import ScalingConfig, ScalingConfigError
from fleetwarden.scaling.signal import Decision, DecisionReason, ScalingSignal, SignalError
from fleetwarden.scaling.strategies import (
    SCALERS,
    DeferredArimaGapScaler,
    DeferredUtilisationScaler,
    ImmediateScaler,
    ReactiveScaler,
    Scaler,
    make_scaler,
)

__all__ = [
    "SCALERS",
    "Decision",
    "DecisionReason",
    "DeferredArimaGapScaler",
    "DeferredUtilisationScaler",
    "ImmediateScaler",
    "ReactiveScaler",
    "Scaler",
    "ScalingConfig",
    "ScalingConfigError",
    "ScalingSignal",
    "SignalError",
    "make_scaler",
]
