"""What the fleet simulator consumes: a stream of requests, each with a model, an origin region,
a tenant and token counts, in arrival order. Three sources produce it (the built-in model,
ServeGen regeneration, per-request traces); this module holds what they share.

Placement is synthetic everywhere: none of the public traces records regions, so requests are
assigned to regions by a declared, seeded-independent rule (`RegionRule`: a stable hash of a key
such as the client, weighted per region). Reports must say so; `WorkloadInfo.notes` carries the
sentence.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from fleetwarden.api.enums import Tier

Z99 = 2.3263478740408408
"""Standard normal quantile at 0.99: a lognormal with median m and 99th percentile p has sigma
ln(p / m) / Z99."""


class WorkloadError(ValueError):
    """A workload cannot be built: bad parameters, missing data, or a model the fleet lacks."""


@dataclass(slots=True)
class SimRequest:
    """One request as a client sends it to the fleet. Treated as a value: nothing changes one
    after it is made (not frozen only because frozen dataclasses are slow to build, and a day of
    traffic is millions of them)."""

    arrival_s: float
    model: str
    """The served model name (the OpenAI `model` field)."""
    region: str
    """Where the client is (the request's home region)."""
    tenant: str
    input_tokens: int
    output_tokens: int
    tier: Tier | None = None
    """None: the tenant's tier from the TenantPolicy, as the sidecar resolves it."""
    app: str | None = None
    interaction: str | None = None
    stage: str | None = None
    system_tokens: int = 0
    deadline_s: float | None = None
    """Relative to arrival. Interactive: the first token is due then (default: the tier's TTFT
    target). NIW: the item must complete by then (default: the ModelDeployment's deadline)."""


@dataclass(frozen=True)
class WorkloadInfo:
    """What a workload is, for the report."""

    kind: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


class Workload:
    """Requests in arrival order plus a description; iterating again regenerates the same stream."""

    def __init__(self, info: WorkloadInfo, make: Any) -> None:
        self.info = info
        self._make = make

    def __iter__(self) -> Iterator[SimRequest]:
        requests: Iterator[SimRequest] = self._make()
        return requests


def merge(streams: Iterable[Iterable[SimRequest]]) -> Iterator[SimRequest]:
    """Streams already in arrival order, merged; ties keep the order of the streams."""
    return heapq.merge(*streams, key=lambda r: r.arrival_s)


@dataclass(frozen=True)
class RegionRule:
    """Assign a key (client, tenant, session) to a region: a stable hash, weighted per region.

    The hash (CRC-32 of `salt/key`) does not depend on the run's seed, so a client stays in its
    region across seeds and strategies; the weights say what share of keys each region gets.
    """

    weights: Mapping[str, float]
    salt: str = "fleetwarden"

    def __post_init__(self) -> None:
        if not self.weights or any(w < 0 for w in self.weights.values()):
            raise WorkloadError("region weights must be non-negative and name at least one region")
        if sum(self.weights.values()) <= 0:
            raise WorkloadError("region weights must not all be zero")

    @classmethod
    def equal(cls, regions: Sequence[str]) -> RegionRule:
        return cls({r: 1.0 for r in regions})

    def region(self, key: str) -> str:
        names = sorted(self.weights)
        total = sum(self.weights[n] for n in names)
        u = zlib.crc32(f"{self.salt}/{key}".encode()) / 2**32 * total
        for name in names:
            u -= self.weights[name]
            if u < 0:
                return name
        return names[-1]

    def describe(self) -> str:
        shares = ", ".join(f"{k} {v:g}" for k, v in sorted(self.weights.items()))
        return f"synthetic placement: stable hash of the client key, weights {shares}"


@dataclass(frozen=True)
class TierMix:
    """Shares of IW-F, IW-N and NIW; assigned per request or per key (see the users)."""

    iw_f: float = 0.42
    iw_n: float = 0.30
    niw: float = 0.28

    def __post_init__(self) -> None:
        if min(self.iw_f, self.iw_n, self.niw) < 0 or self.iw_f + self.iw_n + self.niw <= 0:
            raise WorkloadError("tier shares must be non-negative and not all zero")

    def normalised(self) -> tuple[float, float, float]:
        total = self.iw_f + self.iw_n + self.niw
        return self.iw_f / total, self.iw_n / total, self.niw / total

    def of_key(self, key: str) -> Tier:
        """A tier for `key` by stable hash (a client keeps its tier)."""
        f, n, _ = self.normalised()
        u = zlib.crc32(f"tier/{key}".encode()) / 2**32
        if u < f:
            return Tier.IW_FAST
        if u < f + n:
            return Tier.IW_NORMAL
        return Tier.NIW


@dataclass(frozen=True)
class LogNormalLength:
    """Token counts with a given median and 99th percentile, clipped to [1, cap]."""

    p50: float
    p99: float
    cap: int = 131_072

    def __post_init__(self) -> None:
        if not 0 < self.p50 <= self.p99:
            raise WorkloadError(f"need 0 < p50 ({self.p50}) <= p99 ({self.p99})")

    @property
    def sigma(self) -> float:
        return math.log(self.p99 / self.p50) / Z99

    @property
    def mean(self) -> float:
        """Mean of the unclipped distribution (the clip changes it negligibly)."""
        return self.p50 * math.exp(self.sigma**2 / 2)

    def sample(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.int64]:
        values = rng.lognormal(math.log(self.p50), self.sigma, n)
        return np.clip(np.rint(values), 1, self.cap).astype(np.int64)


@dataclass(frozen=True)
class QuantileLength:
    """Token counts drawn from known quantiles (p50, p90, p99, max), interpolated in log space.

    ServeGen publishes exactly these per client and window; drawing by inverse CDF through the
    knots reproduces them by construction. Below the median nothing is published: the curve
    mirrors the p50-p90 spread in log space (p10 = p50^2 / p90, as a lognormal would have it),
    then runs down to 1 token at q = 0.
    """

    p50: float
    p90: float
    p99: float
    max: float

    def knots(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        p50 = max(self.p50, 1.0)
        p10 = max(1.0, min(p50, p50 * p50 / max(self.p90, p50)))
        values = np.maximum.accumulate(
            np.maximum([1.0, p10, p50, self.p90, self.p99, self.max], 1.0)
        )
        return np.array([0.0, 0.1, 0.5, 0.9, 0.99, 1.0]), np.log(values)

    def sample(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.int64]:
        q, logv = self.knots()
        values = np.exp(np.interp(rng.random(n), q, logv))
        return np.maximum(np.rint(values), 1).astype(np.int64)


def zipf_shares(n: int, exponent: float) -> npt.NDArray[np.float64]:
    """Shares proportional to 1 / rank^exponent for ranks 1..n."""
    if n < 1:
        raise WorkloadError("need at least one tenant")
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** exponent
    shares: npt.NDArray[np.float64] = weights / weights.sum()
    return shares
