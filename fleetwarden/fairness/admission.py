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
- DRR: tiers are strict bands, so the higher bands are wholly ahead. A band is the tenant's
  configured tier, as DRR has it (`DeficitRoundRobin.tier_of`), never the tier a request is
  labelled with (a label only orders the tenant's own queue). Inside the band a visit adds the
  band's quantum, the same for every tenant (DRR has no per-tenant weight), so the band's
  backlogged tenants are served side by side: until this request's tenant has been served B, its
  work ahead of the request in the band, plus this prompt p, another tenant with backlog b is
  served min(b, B + p) (it runs out first or keeps pace, to within a quantum). Under `requests`
  quanta the pace is equal in requests, not tokens: still the estimate, as it was.
- VTC, WSC (and LCF): the order between tenants is by service counters, not tiers, so the same
  sum runs over every other tenant's backlog in all tiers, weighted: counters are charged over a
  share weight w (weighted VTC and LCF: the tenant's weight; WSC: weight / priority factor), so
  while tenant i is served m = B + p, tenant j is served min(b_j, m * w_j / w_i). Not modelled:
  WSC's per-application normaliser (it rescales requests, not tenants), VTC's dearer output
  tokens, WSC's continuations (which go before counters) and LCF's unlifted counters.

B, the tenant's own work ahead, follows its queue's ordering: all of it under FIFO; its
same-or-higher tiers under priority (DRR: then earlier deadlines); what is due no later under EDF,
and under DPA too, an approximation (DPA's urgency classes reorder by tier near the deadlines).
Arrival breaks ties. `backlog_index.ShareIndex` keeps the share sum, and `backlog_index.OwnOrder`
each tenant's queue in its order (kept only when early rejection is on and the ordering needs it),
in O(log) per change and query (expected, for the treap).

How fast it drains. The rate (`drain.ThroughputEstimate`, fed by the scheduler) is the queue's drain
rate: work dispatched per second, in the same units, counted only while the capacity gate holds
requests back. Then the engine is saturated and the rate is its capacity. Output tokens delivered
per second would not do: at light load they measure demand, not capacity, and they leave out
prompts and unused max_tokens. Time with nothing held back (light load, an idle minute) is not
observed at all, so it neither drags the rate down nor counts as evidence.

When. Only with work queued ahead (an empty queue means the gate admits everything: the engine is
not saturated), once the rate is known, and when the expected wait exceeds the target of the tier
the request is labelled with (the one its deadline was set from: what the client asked for).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from typing import TypedDict

from fleetwarden.api.enums import Ordering, PolicyName, Tier
from fleetwarden.fairness.backlog_index import (
    OwnKey,
    OwnOrder,
    ShareIndex,
    ShareWeight,
    weight_units,
)
from fleetwarden.fairness.config import FairnessConfig, TenantConfig
from fleetwarden.fairness.drain import ThroughputEstimate
from fleetwarden.fairness.drr import DeficitRoundRobin
from fleetwarden.fairness.request import TIER_RANK, Request, SchedulingPolicy


def request_work(request: Request) -> int:
    """What a queued request weighs: its prompt plus its expected output (the gate's reservation)."""
    predicted = request.predicted_output_tokens
    return request.input_tokens + (
        predicted if predicted is not None else request.max_output_tokens
    )


def _deadline_key(request: Request) -> tuple[float, ...]:
    deadline = request.deadline_s
    return (math.inf if deadline is None else deadline,)


def _tier_deadline_key(request: Request) -> tuple[float, ...]:
    return (TIER_RANK[request.tier], *_deadline_key(request))


class AheadRule(StrEnum):
    """Which queued work is ahead of a new request's first token (the module docstring says why)."""

    EVERYTHING = "everything"
    """FCFS with FIFO ordering: all queued work, every tier."""
    TIERS = "tiers"
    """FCFS with another ordering: all queued work of the same or a higher tier."""
    BANDED_SHARES = "banded-shares"
    """DRR: higher bands, then the tenant's backlog B ahead in the band plus the prompt p, then
    min(b, B + p) of every other tenant of the band."""
    SHARES = "shares"
    """VTC, WSC, LCF: the tenant's backlog B ahead plus p, then min(b, (B + p) * w_j / w_i) of
    every other tenant's whole backlog, all tiers alike."""
    SHARES_BY_PRIORITY = "shares-by-priority"
    """As SHARES, with B the tenant's same-or-higher-tier backlog (priority ordering)."""


def ahead_rule(policy: PolicyName, ordering: Ordering) -> AheadRule:
    """The rule for the policy and ordering a scheduler runs."""
    if policy is PolicyName.DRR:
        return AheadRule.BANDED_SHARES
    if policy is PolicyName.FCFS:
        return AheadRule.EVERYTHING if ordering is Ordering.FIFO else AheadRule.TIERS
    return AheadRule.SHARES_BY_PRIORITY if ordering is Ordering.PRIORITY else AheadRule.SHARES


class AheadOptions(TypedDict):
    """`EarlyRejection`'s keywords for what a config's policy serves first (`ahead_options`)."""

    rule: AheadRule
    band_of: Callable[[Request], Tier] | None
    own_key: OwnKey | None
    share_weight: ShareWeight | None


def ahead_options(config: FairnessConfig, policy: SchedulingPolicy) -> AheadOptions:
    """What `policy`, built from `config`, serves first: the rule, DRR's bands (`tier_of`), the
    tenants' own order where the ordering needs one (kept only while early rejection is on:
    nothing asks otherwise), and the share weights."""
    name, ordering = config.policy, config.ordering
    own_key: OwnKey | None = None
    if config.early_rejection and name is not PolicyName.FCFS and ordering is not Ordering.FIFO:
        if ordering is not Ordering.PRIORITY:
            own_key = _deadline_key  # EDF, and DPA approximated
        elif name is PolicyName.DRR:
            own_key = _tier_deadline_key  # else priority's tiers are `Backlog`'s tier sums
    return AheadOptions(
        rule=ahead_rule(name, ordering),
        band_of=policy.tier_of if isinstance(policy, DeficitRoundRobin) else None,
        own_key=own_key,
        share_weight=_share_weight(config),
    )


def _share_weight(config: FairnessConfig) -> ShareWeight | None:
    """Weighted VTC and LCF divide charges by the weight, WSC by weight / E; DRR and FCFS have
    no per-tenant share. None too when every tenant's is the same. Exact fractions of the floats
    (weight / E neither rounds nor overflows) over the least of them: the least share is 1, so
    `weight_units` keeps 30 bits of every ratio however small the configured weights are."""
    if config.policy in (PolicyName.VTC, PolicyName.LCF):
        wsc = False
    elif config.policy is PolicyName.WSC:
        wsc = True
    else:
        return None

    def settings(t: TenantConfig) -> tuple[float, float]:
        return t.weight, t.priority_factor if wsc else 1.0

    tenants, defaults = config.tenants, config.defaults
    distinct = {settings(t) for t in (defaults, *tenants.values())}  # few: Fractions cost
    exact = {pair: Fraction(pair[0]) / Fraction(pair[1]) for pair in distinct}
    least = min(exact.values())
    if max(exact.values()) == least:
        return None
    share = {pair: weight / least for pair, weight in exact.items()}
    by_tenant = {name: share[settings(t)] for name, t in tenants.items()}
    default = share[settings(defaults)]
    return lambda tenant: by_tenant.get(tenant, default)


@dataclass
class _TierBacklog:
    tokens: int = 0
    by_tenant: dict[str, int] = field(default_factory=dict)
    shares: ShareIndex = field(default_factory=ShareIndex)

    def change(self, tenant: str, work: int, units: int = 1) -> None:
        self.tokens += work
        before = self.by_tenant.get(tenant, 0)
        left = before + work
        if left > 0:
            self.by_tenant[tenant] = left
        else:
            self.by_tenant.pop(tenant, None)
        self.shares.move(before, max(left, 0), units)


class Backlog:
    """Queued work per band (a tier: DRR's `band_of`, else the request's own) and per tenant,
    per tenant over all tiers, and, with `own_key`, per tenant in its queue's order, kept in step
    with the policy's queue (O(log) updates). `share_weight` weighs the tenants' shares."""

    def __init__(
        self,
        *,
        band_of: Callable[[Request], Tier] | None = None,
        own_key: OwnKey | None = None,
        share_weight: ShareWeight | None = None,
    ) -> None:
        self._tiers: dict[Tier, _TierBacklog] = {tier: _TierBacklog() for tier in TIER_RANK}
        self._all = _TierBacklog(shares=ShareIndex(weighted=share_weight is not None))
        self._requests = 0
        self._band_of = band_of
        self._own = None if own_key is None else OwnOrder(own_key)
        self._weight = share_weight

    @property
    def empty(self) -> bool:
        """Nothing queued (counted in requests: a queued request may weigh 0 tokens)."""
        return self._requests <= 0

    def _band(self, request: Request) -> Tier:
        return request.tier if self._band_of is None else self._band_of(request)

    def _units(self, tenant: str, *, up: bool = False) -> int:
        return 1 if self._weight is None else weight_units(self._weight(tenant), up=up)

    def add(self, request: Request) -> None:
        self._change(request, 1)

    def discard(self, request: Request) -> None:
        self._change(request, -1)

    def _change(self, request: Request, sign: int) -> None:
        tenant, work, band = request.tenant, sign * request_work(request), self._band(request)
        units = self._units(tenant)  # first: a bad weight changes nothing
        self._requests += sign
        self._tiers[band].change(tenant, work)
        self._all.change(tenant, work, units)
        if self._own is not None:
            self._own.change(band, request, work if sign > 0 else None)

    def queued_ahead(self, request: Request, *, rule: AheadRule) -> int:
        """Queued tokens served before `request`'s first token (0: nothing is ahead of it)."""
        if rule is AheadRule.EVERYTHING:
            return self._all.tokens
        prompt = max(0, request.input_tokens)
        tenant, own = request.tenant, self._own
        if rule is AheadRule.SHARES or rule is AheadRule.SHARES_BY_PRIORITY:
            whole = self._all.by_tenant.get(tenant, 0)
            if own is not None:
                mine = sum(own.ahead(tier, request) for tier in TIER_RANK)
            elif rule is AheadRule.SHARES:
                mine = whole
            else:
                mine = sum(
                    b.by_tenant.get(tenant, 0)
                    for t, b in self._tiers.items()
                    if TIER_RANK[t] <= request.tier_rank
                )
            units, whole_units = self._units(tenant, up=True), self._units(tenant)
            return mine + self._all.shares.sum_min(mine + prompt, whole, units, whole_units)
        band = self._band(request)
        rank = TIER_RANK[band]
        higher = sum(b.tokens for t, b in self._tiers.items() if TIER_RANK[t] < rank)
        backlog = self._tiers[band]
        if rule is AheadRule.TIERS:
            return higher + backlog.tokens
        whole = backlog.by_tenant.get(tenant, 0)
        mine = whole if own is None else own.ahead(band, request)
        return higher + mine + backlog.shares.sum_min(mine + prompt, whole)

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
        band_of: Callable[[Request], Tier] | None = None,
        own_key: OwnKey | None = None,
        share_weight: ShareWeight | None = None,
    ) -> None:
        """`rule` says what is ahead (`ahead_rule(policy, ordering)`); the rest is `Backlog`'s."""
        if not tolerance > 0:
            raise ValueError(f"tolerance must be > 0, got {tolerance}")
        self._targets = dict(ttft_targets_s)
        self.estimate = estimate
        self.backlog = Backlog(band_of=band_of, own_key=own_key, share_weight=share_weight)
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
        """Whether `request` cannot meet its tier's target. The O(1) checks go first: with no
        drain rate yet (light load, the usual case) nothing is rejected, and the backlog walk,
        the costly part of every offer, is skipped; under saturation it runs once."""
        target = self._targets.get(request.tier)
        if target is None:
            return False
        rate = self.estimate.rate(now)
        if rate is None or rate <= 0:
            return False
        ahead = self.backlog.queued_ahead(request, rule=self.rule)
        if ahead <= 0:
            return False
        return (ahead + max(0, request.input_tokens)) / rate > target * self._tolerance
