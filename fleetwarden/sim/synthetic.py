"""Synthetic workloads of the VTC paper's experiments (section 5.2), seeded and deterministic.

Each tenant sends requests at a constant rate: the first at U(0, 1) / rate (so tenants do not
start in lockstep), then every 1 / rate. An ON/OFF tenant sends only during ON phases.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from fleetwarden.sim.trace import TraceRequest


@dataclass(frozen=True)
class OnOff:
    """Alternating ON and OFF phases, starting ON at time 0."""

    on_s: float
    off_s: float

    def is_on(self, t: float) -> bool:
        return t % (self.on_s + self.off_s) < self.on_s


def constant_rate_trace(
    rates_per_s: Mapping[str, float],
    duration_s: float,
    *,
    seed: int = 42,
    input_tokens: int | Mapping[str, int] = 256,
    output_tokens: int | Mapping[str, int] = 256,
    on_off: Mapping[str, OnOff] | None = None,
) -> list[TraceRequest]:
    """Requests of every tenant in arrival order."""
    rng = random.Random(seed)
    requests: list[TraceRequest] = []
    for tenant in sorted(rates_per_s):
        rate = rates_per_s[tenant]
        if rate <= 0:
            continue
        n_in = input_tokens if isinstance(input_tokens, int) else input_tokens[tenant]
        n_out = output_tokens if isinstance(output_tokens, int) else output_tokens[tenant]
        phase = (on_off or {}).get(tenant)
        t = rng.random() / rate
        while t < duration_s:
            if phase is None or phase.is_on(t):
                requests.append(TraceRequest(t, tenant, n_in, n_out))
            t += 1.0 / rate
    return sorted(requests, key=lambda r: (r.arrival_s, r.tenant))
