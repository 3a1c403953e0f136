"""Early rejection (the tenant-DRR design's admission check): refuse at once what cannot be on time.

If the work queued ahead of a request means it cannot get its first token within its tier's TTFT
target even when dispatched in order, answering 429 now is kinder than queueing it to time out.

Work ahead depends on the policy. Under FCFS everything queued in the same or a higher tier is
ahead. Under a fair policy (VTC, WSC, DRR) a tenant shares the engine with the other backlogged
tenants of its tier, so its request waits for its own tenant's queued work times the number of
backlogged tenants (each gets about 1/n of the throughput), plus all higher-tier work. Counting
the whole queue there would reject exactly the light tenants fair scheduling protects. Work is
measured in tokens (prompt plus expected output) and divided by the measured token throughput.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetwarden.api.enums import Tier
from fleetwarden.fairness.request import TIER_RANK, Request


def request_work(request: Request) -> int:
    predicted = request.predicted_output_tokens
    return request.input_tokens + (
        predicted if predicted is not None else request.max_output_tokens
    )


class ThroughputEstimate:
    """Tokens per second delivered by the engine: an exponentially weighted moving average.

    Each observation is a count of tokens delivered since the previous one; the average forgets
    with the given half-life, so a slowdown shows within seconds. None until `min_span_s` of
    observations have accumulated (no rejection is better than one on no evidence).
    """

    def __init__(self, half_life_s: float = 10.0, min_span_s: float = 5.0) -> None:
        self._half_life_s = half_life_s
        self._min_span_s = min_span_s
        self._first_s: float | None = None
        self._last_s: float | None = None
        self._rate: float | None = None

    def observe(self, tokens: int, now: float) -> None:
        if self._last_s is None:
            self._first_s = self._last_s = now
            return
        elapsed = now - self._last_s
        if elapsed <= 0:
            return
        sample = tokens / elapsed
        weight = 1.0 - math.exp(-math.log(2) * elapsed / self._half_life_s)
        self._rate = sample if self._rate is None else self._rate + weight * (sample - self._rate)
        self._last_s = now

    def rate(self, now: float) -> float | None:
        if self._first_s is None or self._rate is None or now - self._first_s < self._min_span_s:
            return None
        return self._rate


@dataclass
class _TierBacklog:
    tokens: int = 0
    by_tenant: dict[str, int] = field(default_factory=dict)


class Backlog:
    """Queued work per tier and per tenant, kept in step with the policy's queue (O(1) updates)."""

    def __init__(self) -> None:
        self._tiers: dict[Tier, _TierBacklog] = {tier: _TierBacklog() for tier in TIER_RANK}

    def add(self, request: Request) -> None:
        self._change(request, request_work(request))

    def discard(self, request: Request) -> None:
        self._change(request, -request_work(request))

    def _change(self, request: Request, work: int) -> None:
        tier = self._tiers[request.tier]
        tier.tokens += work
        left = tier.by_tenant.get(request.tenant, 0) + work
        if left > 0:
            tier.by_tenant[request.tenant] = left
        else:
            tier.by_tenant.pop(request.tenant, None)

    def work_ahead(self, request: Request, *, fair: bool) -> int:
        """Tokens that will be served before `request` finishes prefill, at this moment."""
        rank = request.tier_rank
        higher = sum(b.tokens for t, b in self._tiers.items() if TIER_RANK[t] < rank)
        own = self._tiers[request.tier]
        if not fair:
            return higher + own.tokens + request_work(request)
        tenants = len(own.by_tenant) + (0 if request.tenant in own.by_tenant else 1)
        mine = own.by_tenant.get(request.tenant, 0) + request_work(request)
        return higher + mine * tenants


class EarlyRejection:
    """Reject a request whose expected wait already exceeds its tier's TTFT target."""

    def __init__(
        self,
        ttft_targets_s: Mapping[Tier, float],
        estimate: ThroughputEstimate,
        *,
        fair: bool,
        tolerance: float = 1.0,
    ) -> None:
        self._targets = dict(ttft_targets_s)
        self.estimate = estimate
        self.backlog = Backlog()
        self._fair = fair
        self._tolerance = tolerance

    def expected_wait_s(self, request: Request, now: float) -> float | None:
        rate = self.estimate.rate(now)
        if rate is None or rate <= 0:
            return None
        return self.backlog.work_ahead(request, fair=self._fair) / rate

    def should_reject(self, request: Request, now: float) -> bool:
        target = self._targets.get(request.tier)
        wait = self.expected_wait_s(request, now)
        return target is not None and wait is not None and wait > target * self._tolerance
