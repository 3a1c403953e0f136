"""Output-length predictions for replaying VTC with length prediction (the VTC paper's B.3).

- oracle: the true output length (a predictor with 100% accuracy);
- noisy: the true length times U(1 - x, 1 + x), seeded (the paper's "VTC (+-50%)");
- moving average: per tenant, the mean output of its last five completed requests, which is what a
  sidecar can know in production (`fleetwarden.fairness.prediction.MovingAverage`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from fleetwarden.fairness.prediction import MovingAverage
from fleetwarden.sim.trace import TraceRequest

__all__ = ["MovingAverage", "noisy", "oracle"]


def oracle(trace: Sequence[TraceRequest]) -> list[int | None]:
    return [t.output_tokens for t in trace]


def noisy(trace: Sequence[TraceRequest], error: float, seed: int = 42) -> list[int | None]:
    """True lengths off by up to +-`error` (0.5 for +-50%), uniformly, seeded."""
    rng = random.Random(seed)
    return [max(1, round(t.output_tokens * rng.uniform(1 - error, 1 + error))) for t in trace]
