"""Output-length prediction a sidecar can do in production: a per-tenant moving average.

VTC with length prediction (the VTC paper's Algorithm 3, "VTC (predict)") charges the predicted
output at dispatch; the paper's predictor is the mean output of the tenant's last five requests.
"""

from __future__ import annotations

from collections import deque


class MovingAverage:
    """Mean output of a tenant's last `window` completed requests; `default` before any."""

    def __init__(self, window: int = 5, default: int = 256) -> None:
        self._window = window
        self._default = default
        self._seen: dict[str, deque[int]] = {}

    def predict(self, tenant: str) -> int:
        seen = self._seen.get(tenant)
        return round(sum(seen) / len(seen)) if seen else self._default

    def observe(self, tenant: str, output_tokens: int) -> None:
        self._seen.setdefault(tenant, deque(maxlen=self._window)).append(output_tokens)

    def forget(self, tenant: str) -> None:
        """Drop an idle tenant's history (`fairness.idle`): it is predicted `default` again."""
        self._seen.pop(tenant, None)
