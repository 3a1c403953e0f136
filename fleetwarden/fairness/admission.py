"""Early rejection (the tenant-DRR design's admission check): refuse at once what cannot be on time.

If the work queued ahead of a request means it cannot get its first token within its tier's TTFT
target even when dispatched in order, answering 429 now is kinder than queueing it to time out.
A refusal is final for the client and a late answer is not, so every estimate here errs towards
admitting.

What is ahead. Work is counted in the capacity gate's units: a queued request weighs its prompt
plus its expected output (the prediction, else max_tokens). The new request adds only its own
prompt: its first token waits for its prefill, never for its own output. Which queued work is
ahead depends on the policy and ordering the scheduler runs (`ahead_rule`; `AheadRule` has the
rule of each):

- FCFS with FIFO ordering: everything queued, of every tier (one queue in arrival order).
- FCFS with priority, EDF or DPA ordering: everything queued in the same or a higher tier. Exact
  for priority (tier, then arrival); for EDF and DPA, whose deadlines mostly follow the tiers'
  targets, an approximation.
- DRR: tiers are strict bands, so the higher tiers are wholly ahead. Inside the band a visit adds
  the band's quantum, the same for every tenant, so the band's backlogged tenants are served side
  by side: until this request's tenant has been served its backlog B in the band plus this prompt
  p, another tenant with backlog b is served min(b, B + p) (it runs out first or keeps pace, to
  within a quantum). Under `requests` quanta the pace is equal in requests, not tokens: still the
  estimate, as it was.
- VTC, WSC (and LCF): the order between tenants is by service counters, not tiers (a tier only
  orders a tenant's own queue), so the same fair-share sum runs over every other tenant's backlog
  in all tiers: min(b, B + p) with b its whole backlog. B is the tenant's own backlog ahead of the
  request in its own queue: all of it under FIFO, its same-or-higher tiers under priority, and,
  because the position is not cheaply known, all of it under EDF and DPA (an over-count). WSC's
  continuations, which go before counters, and LCF's unlifted counters are not modelled.

`_ShareIndex` keeps the fair-share sum in O(log) per change and query, per tier and over all tiers.

How fast it drains. The rate (`ThroughputEstimate`, fed by the scheduler) is the queue's drain
rate: work dispatched per second, in the same units, counted only while the capacity gate holds
requests back. Then the engine is saturated and the rate is its capacity. Output tokens delivered
per second would not do: at light load they measure demand, not capacity, and they leave out
prompts and unused max_tokens. Time with nothing held back (light load, an idle minute) is not
observed at all, so it neither drags the rate down nor counts as evidence.

When. Only with work queued ahead (an empty queue means the gate admits everything: the engine is
not saturated), once the rate is known, and when the expected wait exceeds the tier's target.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from fleetwarden.api.enums import Ordering, PolicyName, Tier
from fleetwarden.fairness.request import TIER_RANK, Request


def request_work(request: Request) -> int:
    """What a queued request weighs: its prompt plus its expected output (the gate's reservation)."""
    predicted = request.predicted_output_tokens
    return request.input_tokens + (
        predicted if predicted is not None else request.max_output_tokens
    )


class ThroughputEstimate:
    """Tokens per second over the observed time: an exponentially weighted moving average.

    Each observation is a count of tokens since the previous one; the average forgets with the
    given half-life, so a slowdown shows within seconds. Observations at one instant are one
    sample. Between `pause()` and the next `resume(now)` time is not observed at all, and nor are
    tokens: a caller pauses while the rate it measures is not the one it wants (for early
    rejection, while the engine is not saturated). None until `min_span_s` of observed time has
    accumulated (no rejection is better than one on no evidence).
    """

    def __init__(
        self, half_life_s: float = 10.0, min_span_s: float = 5.0, *, paused: bool = False
    ) -> None:
        if not half_life_s > 0 or not min_span_s >= 0:
            raise ValueError(
                f"half_life_s must be > 0 and min_span_s >= 0, got {half_life_s}, {min_span_s}"
            )
        self._half_life_s = half_life_s
        self._min_span_s = min_span_s
        self._paused = paused
        self._first_s: float | None = None
        self._last_s: float | None = None
        self._rate: float | None = None
        self._observed_s = 0.0
        self._pending = 0
        """Tokens observed at the instant observation (re)started: they join the next sample."""
        self._last_weight = 0.0
        self._last_elapsed = 0.0
        """The sample ending at `_last_s`: tokens observed at that same instant join it."""

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        """Stop observing: tokens and time until the next `resume` are left out."""
        self._paused = True

    def resume(self, now: float) -> None:
        """Observe from `now` on (a no-op while observing already)."""
        if self._paused or self._last_s is None:
            self._paused = False
            self._start(now)

    def _start(self, now: float) -> None:
        if self._first_s is None:
            self._first_s = now
        self._last_s = now
        self._pending = 0
        self._last_elapsed = 0.0

    def observe(self, tokens: int, now: float) -> None:
        if self._paused:
            return
        last = self._last_s
        if last is None:
            self._start(now)
            return
        elapsed = now - last
        if elapsed < 0:
            return
        if elapsed == 0:
            if self._last_elapsed > 0 and self._rate is not None:
                self._rate += self._last_weight * tokens / self._last_elapsed
            else:
                self._pending += tokens
            return
        sample = (tokens + self._pending) / elapsed
        self._pending = 0
        if self._rate is None:
            weight = 1.0
            self._rate = sample
        else:
            weight = 1.0 - math.exp(-math.log(2) * elapsed / self._half_life_s)
            self._rate += weight * (sample - self._rate)
        self._last_weight, self._last_elapsed = weight, elapsed
        self._observed_s += elapsed
        self._last_s = now

    def rate(self, now: float) -> float | None:
        if (
            self._first_s is None
            or self._rate is None
            or self._observed_s < self._min_span_s
            or now - self._first_s < self._min_span_s
        ):
            return None
        return self._rate


_SUB_BUCKETS = 16
"""`_ShareIndex` buckets per octave of backlog size: its sum is exact to within 1/16."""
_EXACT_BELOW = 2 * _SUB_BUCKETS
"""Backlogs below this many tokens have a bucket each."""
_MAX_BITS = 40
"""Backlogs of 2**40 tokens and more share the top bucket (still a lower bound)."""
_BUCKETS = (_MAX_BITS - 4) * _SUB_BUCKETS + _SUB_BUCKETS
"""Bucket indices run 1..._BUCKETS - 1 (a backlog of 0 is never stored)."""


def _bucket(tokens: int) -> int:
    """Log-linear bucket of a backlog >= 1: 16 per octave, so each spans under 1/16 of its floor."""
    if tokens < _EXACT_BELOW:
        return tokens
    top = min(tokens.bit_length(), _MAX_BITS) - 1
    shift = top - 4
    return shift * _SUB_BUCKETS + (min(tokens, (1 << _MAX_BITS) - 1) >> shift)


def _bucket_floor(bucket: int) -> int:
    if bucket < _EXACT_BELOW:
        return bucket
    shift = bucket // _SUB_BUCKETS - 1
    return (bucket % _SUB_BUCKETS + _SUB_BUCKETS) << shift


class _ShareIndex:
    """The tenants' backlogs of one tier, for the sum over them of min(backlog, m) in O(log).

    Backlogs are counted and summed per log-linear bucket in Fenwick trees. Below m's bucket the
    sum is exact; above it every tenant adds m; in m's own bucket each adds the bucket's floor, at
    most 1/16 short of its true share. So the sum is a lower bound within 1/16 (an exact sum
    needs the tenants in order, and a scan per arrival is O(tenants)), and it never decreases when
    a backlog or m grows, which keeps rejection monotone in the backlog ahead.
    """

    __slots__ = ("_count", "_count_at", "_sum", "_tenants")

    def __init__(self) -> None:
        self._count = [0] * _BUCKETS
        self._sum = [0] * _BUCKETS
        self._count_at = [0] * _BUCKETS
        self._tenants = 0

    def _add(self, tokens: int, sign: int) -> None:
        index = _bucket(tokens)
        self._count_at[index] += sign
        self._tenants += sign
        counts, sums, delta = self._count, self._sum, sign * tokens
        while index < _BUCKETS:
            counts[index] += sign
            sums[index] += delta
            index += index & -index

    def move(self, old: int, new: int) -> None:
        """A tenant's backlog went from `old` to `new` tokens (0: not backlogged)."""
        if old > 0:
            self._add(old, -1)
        if new > 0:
            self._add(new, 1)

    def sum_min(self, m: int, exclude: int) -> int:
        """Lower bound of the sum of min(backlog, m) over the tenants but one whose backlog is
        `exclude` (0: none; it may exceed m)."""
        if m <= 0 or self._tenants == 0:
            return 0
        top = _bucket(m)
        floor = _bucket_floor(top)
        below_count = below_sum = 0
        index = top - 1
        counts, sums = self._count, self._sum
        while index > 0:
            below_count += counts[index]
            below_sum += sums[index]
            index -= index & -index
        at = self._count_at[top]
        total = below_sum + at * floor + (self._tenants - below_count - at) * m
        if exclude > 0:
            excluded = _bucket(exclude)
            total -= exclude if excluded < top else floor if excluded == top else m
        return max(0, total)


class AheadRule(StrEnum):
    """Which queued work is ahead of a new request's first token (the module docstring says why)."""

    EVERYTHING = "everything"
    """FCFS with FIFO ordering: all queued work, every tier."""
    TIERS = "tiers"
    """FCFS with another ordering: all queued work of the same or a higher tier."""
    BANDED_SHARES = "banded-shares"
    """DRR: higher tiers, then the tenant's backlog B of the tier plus the prompt p, then
    min(b, B + p) of every other tenant of the tier."""
    SHARES = "shares"
    """VTC, WSC, LCF: the tenant's whole backlog B plus p, then min(b, B + p) of every other
    tenant's whole backlog, all tiers alike."""
    SHARES_BY_PRIORITY = "shares-by-priority"
    """As SHARES, with B only the tenant's same-or-higher-tier backlog (priority ordering)."""


def ahead_rule(policy: PolicyName, ordering: Ordering) -> AheadRule:
    """The rule for the policy and ordering a scheduler runs."""
    if policy is PolicyName.DRR:
        return AheadRule.BANDED_SHARES
    if policy is PolicyName.FCFS:
        return AheadRule.EVERYTHING if ordering is Ordering.FIFO else AheadRule.TIERS
    return AheadRule.SHARES_BY_PRIORITY if ordering is Ordering.PRIORITY else AheadRule.SHARES


@dataclass
class _TierBacklog:
    tokens: int = 0
    by_tenant: dict[str, int] = field(default_factory=dict)
    shares: _ShareIndex = field(default_factory=_ShareIndex)

    def change(self, tenant: str, work: int) -> None:
        self.tokens += work
        before = self.by_tenant.get(tenant, 0)
        left = before + work
        if left > 0:
            self.by_tenant[tenant] = left
        else:
            self.by_tenant.pop(tenant, None)
        self.shares.move(before, max(left, 0))


class Backlog:
    """Queued work per tier and per tenant, and per tenant over all tiers, kept in step with the
    policy's queue (O(log) updates)."""

    def __init__(self) -> None:
        self._tiers: dict[Tier, _TierBacklog] = {tier: _TierBacklog() for tier in TIER_RANK}
        self._all = _TierBacklog()
        self._requests = 0

    @property
    def empty(self) -> bool:
        """Nothing queued (counted in requests: a queued request may weigh 0 tokens)."""
        return self._requests <= 0

    def add(self, request: Request) -> None:
        self._requests += 1
        self._change(request, request_work(request))

    def discard(self, request: Request) -> None:
        self._requests -= 1
        self._change(request, -request_work(request))

    def _change(self, request: Request, work: int) -> None:
        self._tiers[request.tier].change(request.tenant, work)
        self._all.change(request.tenant, work)

    def queued_ahead(self, request: Request, *, rule: AheadRule) -> int:
        """Queued tokens served before `request`'s first token (0: nothing is ahead of it)."""
        if rule is AheadRule.EVERYTHING:
            return self._all.tokens
        prompt = max(0, request.input_tokens)
        rank = request.tier_rank
        if rule is AheadRule.SHARES or rule is AheadRule.SHARES_BY_PRIORITY:
            whole = self._all.by_tenant.get(request.tenant, 0)
            if rule is AheadRule.SHARES:
                mine = whole
            else:
                mine = sum(
                    b.by_tenant.get(request.tenant, 0)
                    for t, b in self._tiers.items()
                    if TIER_RANK[t] <= rank
                )
            return mine + self._all.shares.sum_min(mine + prompt, whole)
        higher = sum(b.tokens for t, b in self._tiers.items() if TIER_RANK[t] < rank)
        own = self._tiers[request.tier]
        if rule is AheadRule.TIERS:
            return higher + own.tokens
        mine = own.by_tenant.get(request.tenant, 0)
        return higher + mine + own.shares.sum_min(mine + prompt, mine)

    def work_ahead(self, request: Request, *, rule: AheadRule) -> int:
        """Tokens served before `request`'s first token: the queue ahead and its own prompt."""
        return self.queued_ahead(request, rule=rule) + max(0, request.input_tokens)


class EarlyRejection:
    """Reject a request whose expected wait already exceeds its tier's TTFT target.

    The scheduler reports the queue's events (`queued`, `held`, `dispatched`; removals go to
    `backlog.discard`) and `estimate` becomes the drain rate: work dispatched per second while the
    gate held requests back. A queue that empties pauses it; the gate refusing the head resumes it.
    """

    def __init__(
        self,
        ttft_targets_s: Mapping[Tier, float],
        estimate: ThroughputEstimate,
        *,
        rule: AheadRule,
        tolerance: float = 1.0,
    ) -> None:
        """`rule` says what is ahead (`ahead_rule(policy, ordering)`)."""
        if not tolerance > 0:
            raise ValueError(f"tolerance must be > 0, got {tolerance}")
        self._targets = dict(ttft_targets_s)
        self.estimate = estimate
        self.backlog = Backlog()
        self.rule = rule
        self._tolerance = tolerance

    def queued(self, request: Request, now: float) -> None:
        """`request` joined the queue. Joining an empty one means the gate had admitted everything
        before it: no saturated drain was under way, so observation stays paused until `held`."""
        if self.backlog.empty:
            self.estimate.pause()
        self.backlog.add(request)

    def held(self, now: float) -> None:
        """The gate refused the policy's head: the engine is saturated, the drain counts from now."""
        self.estimate.resume(now)

    def dispatched(self, request: Request, now: float) -> None:
        """`request` left the queue for the engine (already discarded from `backlog`)."""
        self.estimate.observe(request_work(request), now)
        if self.backlog.empty:
            self.estimate.pause()

    def expected_wait_s(self, request: Request, now: float) -> float | None:
        rate = self.estimate.rate(now)
        if rate is None or rate <= 0:
            return None
        return self.backlog.work_ahead(request, rule=self.rule) / rate

    def should_reject(self, request: Request, now: float) -> bool:
        target = self._targets.get(request.tier)
        if target is None or self.backlog.queued_ahead(request, rule=self.rule) <= 0:
            return False
        wait = self.expected_wait_s(request, now)
        return wait is not None and wait > target * self._tolerance
