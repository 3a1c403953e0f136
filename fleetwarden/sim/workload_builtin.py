"""The built-in workload: realistic traffic for any fleet with no data files at all.

Every figure below comes from a public trace in `../shared/data` (see its README) or from the
SageServe paper; the tests re-derive the trace-based ones from the data when it is present.

- Daily cycle (`HOUR_FACTORS`): RAGPulse's requests per hour of the local day over its 7 days,
  divided by their mean. Its first request comes at 04:01:56 UTC on Wednesday 2025-09-10 (the
  epoch in ms that starts its first session id, 82 s into the raw trace), 12:01:56 in the
  service's UTC+8, which places every later request in its local hour.
  RAGPulse is a university service whose nights are nearly empty (0.06 of the mean at 04:00);
  `diurnal_depth` blends it with a flat profile (1.0 is RAGPulse's own cycle, 0 is flat). The
  default 0.75 keeps about a quarter of the mean load at night, nearer SageServe's enterprise
  traffic (Figs. 3-5), whose nights quiet down but do not empty.
- Weekly cycle (`WEEKEND_FACTOR`): RAGPulse's weekend days carry 780 requests on average against
  1,109 on weekdays, 0.70.
- Interactive traffic follows both cycles; NIW traffic is flat (SageServe section 3: NIW shows no
  clear periodicity and "a consistent load throughout the week").
- Tier shares (`TierMix` defaults): SageServe section 3, July 2025: IW-F and IW-N are 72% of
  requests, IW-F the largest; we use 42% IW-F, 30% IW-N, 28% NIW.
- Applications (`DEFAULT_APPS`): token lengths are lognormal through the traces' median and 99th
  percentile: chat from Azure 2023 conversation (input 1020/4142, output 129/601), code from Azure
  2023 code (1469/7436, 13/251), rag from RAGPulse (3140/5438, 234/891). Shares: SageServe Fig. 6a
  has 41.2% of requests from RAG; the rest is split 35% chat, 24% code.
- Tenants: shares proportional to 1/rank^1.2, the slope of ServeGen's per-client request shares
  over the 50 largest clients (1.18 for m-large, 1.28 for m-mid).
- Level: the peak interactive demand of each (model, region) is `peak_fraction` of what its
  instances serve at `maxInstances` (tokens/s from the ModelDeployment's throughput), or given.

Arrivals are a Poisson process whose rate is constant per minute (`slot_s`) and follows the
cycles; each (stream, hour) has its own seeded generator, so a run's first hours do not depend on
its length. Bursts multiply the interactive rate of chosen models and regions for a while.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from fleetwarden.api.enums import Tier
from fleetwarden.sim.fleet_spec import Fleet
from fleetwarden.sim.workload import (
    LogNormalLength,
    SimRequest,
    TierMix,
    Workload,
    WorkloadError,
    WorkloadInfo,
    zipf_shares,
)

HOUR_FACTORS = (
    1.091, 0.375, 0.209, 0.101, 0.064, 0.081, 0.111, 0.361, 0.773, 1.013, 1.510, 1.554,
    1.294, 1.408, 1.594, 1.668, 1.473, 1.283, 1.483, 1.543, 1.294, 1.250, 1.371, 1.094,
)  # fmt: skip
"""RAGPulse requests per local hour of day (00:00-01:00 first), over their mean."""
WEEKEND_FACTOR = 0.70
"""RAGPulse: mean requests per weekend day over mean per weekday (780 / 1109)."""
ZIPF_EXPONENT = 1.2
"""ServeGen: slope of log(client share) against log(rank) over the top 50 clients."""
HOUR_S = 3600.0
DAY_S = 86400.0


@dataclass(frozen=True)
class AppProfile:
    """Token lengths of one application's requests, and its share of requests."""

    share: float
    input: LogNormalLength
    output: LogNormalLength

    @property
    def mean_tokens(self) -> float:
        return self.input.mean + self.output.mean


DEFAULT_APPS: Mapping[str, AppProfile] = {
    "chat": AppProfile(0.35, LogNormalLength(1020, 4142), LogNormalLength(129, 601)),
    "code": AppProfile(0.24, LogNormalLength(1469, 7436), LogNormalLength(13, 251)),
    "rag": AppProfile(0.41, LogNormalLength(3140, 5438), LogNormalLength(234, 891)),
}


@dataclass(frozen=True)
class Burst:
    """Interactive rate times `factor` during [start_s, start_s + duration_s)."""

    start_s: float
    duration_s: float
    factor: float
    model: str | None = None
    """Served name; None: every model."""
    region: str | None = None
    """None: every region."""

    def applies(self, model: str, region: str) -> bool:
        return self.model in (None, model) and self.region in (None, region)


@dataclass(frozen=True)
class BuiltinWorkload:
    """Parameters of the built-in workload (module docstring for where each default comes from)."""

    duration_s: float = DAY_S
    seed: int = 0
    peak_fraction: float = 0.6
    """Peak interactive tokens/s of a (model, region) over its capacity at maxInstances."""
    peak_tps: Mapping[str, Mapping[str, float]] | None = None
    """Explicit peak interactive tokens/s per served model and region (overrides the above)."""
    rate_scale: float = 1.0
    """Multiplies every rate: an easy way to shrink a run."""
    apps: Mapping[str, AppProfile] = field(default_factory=lambda: dict(DEFAULT_APPS))
    tenants: int = 20
    zipf_exponent: float = ZIPF_EXPONENT
    tenant_names: Sequence[str] | None = None
    """Names of the tenants, largest first; default tenant-00, tenant-01, ..."""
    tiers: TierMix = field(default_factory=TierMix)
    diurnal_depth: float = 0.75
    start_weekday: int = 0
    """Weekday at time 0 (0 is Monday)."""
    start_hour: float = 0.0
    """Local hour of day at time 0."""
    region_offsets_h: Mapping[str, float] = field(default_factory=dict)
    """Hours each region's local time is ahead of time 0's clock (default 0: SageServe saw no
    phase shift between its regions, whose traffic is routed globally)."""
    bursts: Sequence[Burst] = ()
    slot_s: float = 60.0
    """The rate is constant within slots of this length."""

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.rate_scale < 0 or self.slot_s <= 0:
            raise WorkloadError("duration_s and slot_s must be > 0, rate_scale >= 0")
        if not 0 <= self.diurnal_depth <= 1:
            raise WorkloadError("diurnal_depth must be within [0, 1]")
        if not self.apps or sum(a.share for a in self.apps.values()) <= 0:
            raise WorkloadError("at least one application with a positive share is needed")
        if self.tenant_names is not None and len(self.tenant_names) != self.tenants:
            raise WorkloadError("tenant_names must name exactly `tenants` tenants")

    # -- the rate model --------------------------------------------------------------------------

    def day_factor(self, local_hour: float) -> float:
        """The blended daily cycle at a local hour, interpolated between hour midpoints."""
        mean = sum(HOUR_FACTORS) / 24
        x = (local_hour - 0.5) % 24
        i = int(x)
        frac = x - i
        raw = (HOUR_FACTORS[i] * (1 - frac) + HOUR_FACTORS[(i + 1) % 24] * frac) / mean
        return 1 - self.diurnal_depth + self.diurnal_depth * raw

    def cycle(self, t: float, region: str) -> float:
        """Interactive rate relative to its daily mean, at time `t` in `region`."""
        local = t / HOUR_S + self.start_hour + self.region_offsets_h.get(region, 0.0)
        weekday = (self.start_weekday + math.floor(local / 24)) % 7
        week = WEEKEND_FACTOR if weekday >= 5 else 1.0
        return self.day_factor(local % 24) * week

    def peak_cycle(self) -> float:
        return max(self.day_factor(h / 10) for h in range(240))

    def mean_tokens(self) -> float:
        total = sum(a.share for a in self.apps.values())
        return sum(a.share * a.mean_tokens for a in self.apps.values()) / total

    def peak_rates(self, fleet: Fleet) -> dict[tuple[str, str], float]:
        """Peak interactive requests/s per (served model, region)."""
        rates: dict[tuple[str, str], float] = {}
        for model in fleet.models.values():
            for region in model.regions:
                given = (self.peak_tps or {}).get(model.served_name, {}).get(region)
                if given is None:
                    capacity = sum(
                        p.max_instances * p.throughput_tps
                        for p in model.placements
                        if p.region == region
                    )
                    given = self.peak_fraction * capacity
                rates[model.served_name, region] = given * self.rate_scale / self.mean_tokens()
        return rates

    # -- generation ------------------------------------------------------------------------------

    def build(self, fleet: Fleet) -> Workload:
        peaks = self.peak_rates(fleet)
        if self.peak_tps:
            unknown = {(m, r) for m, regions in self.peak_tps.items() for r in regions} - set(peaks)
            if unknown:
                raise WorkloadError(
                    f"peak_tps names (model, region) pairs the fleet lacks: {sorted(unknown)}"
                )
        info = WorkloadInfo(
            kind="builtin",
            parameters={
                "durationSeconds": self.duration_s,
                "seed": self.seed,
                "peakRequestsPerSecond": {f"{m}/{r}": round(v, 6) for (m, r), v in peaks.items()},
                "tiers": dict(zip(("iw-f", "iw-n", "niw"), self.tiers.normalised(), strict=True)),
                "apps": {k: a.share for k, a in self.apps.items()},
                "tenants": self.tenants,
                "diurnalDepth": self.diurnal_depth,
            },
            notes=(
                "Built-in workload: daily and weekly cycles from RAGPulse, lengths from Azure "
                "2023 and RAGPulse, tenant skew from ServeGen (module fleetwarden.sim."
                "workload_builtin). Regions are synthetic: each (model, region) gets its own "
                "traffic in proportion to its capacity.",
            ),
        )
        return Workload(info, lambda: self._generate(peaks))

    def _generate(self, peaks: Mapping[tuple[str, str], float]) -> Iterator[SimRequest]:
        f, n, niw = self.tiers.normalised()
        peak_cycle = self.peak_cycle()
        weekly_mean = (5 + 2 * WEEKEND_FACTOR) / 7
        streams = sorted(peaks)
        hours = math.ceil(self.duration_s / HOUR_S)
        for hour in range(hours):
            chunk: list[tuple[float, int, SimRequest]] = []
            for index, (model, region) in enumerate(streams):
                iw_mean = peaks[model, region] / peak_cycle
                niw_rate = iw_mean * weekly_mean * niw / (f + n) if f + n > 0 else 0.0
                chunk += self._hour(hour, index, model, region, iw_mean, niw_rate)
            chunk.sort(key=lambda e: (e[0], e[1]))
            yield from (request for _, _, request in chunk)

    def _hour(
        self, hour: int, stream: int, model: str, region: str, iw_mean: float, niw_rate: float
    ) -> list[tuple[float, int, SimRequest]]:
        rng = np.random.default_rng([self.seed, stream, hour])
        start = hour * HOUR_S
        end = min(start + HOUR_S, self.duration_s)
        slots = np.arange(start, end, self.slot_s)
        widths = np.minimum(slots + self.slot_s, end) - slots
        iw = np.array(
            [
                self._iw_rate(iw_mean, s + w / 2, model, region)
                for s, w in zip(slots, widths, strict=True)
            ]
        )
        f, n, _ = self.tiers.normalised()
        out: list[tuple[float, int, SimRequest]] = []
        for kind, rates in (("iw", iw), ("niw", np.full(len(slots), niw_rate))):
            counts = rng.poisson(rates * widths)
            total = int(counts.sum())
            if not total:
                continue
            times = np.repeat(slots, counts) + rng.random(total) * np.repeat(widths, counts)
            if kind == "iw":
                fast = rng.random(total) < (f / (f + n) if f + n > 0 else 0.0)
                tiers = [Tier.IW_FAST if x else Tier.IW_NORMAL for x in fast]
            else:
                tiers = [Tier.NIW] * total
            out += self._requests(rng, times, tiers, model, region, stream)
        return out

    def _iw_rate(self, mean: float, t: float, model: str, region: str) -> float:
        rate = mean * self.cycle(t, region)
        for burst in self.bursts:
            if burst.start_s <= t < burst.start_s + burst.duration_s and burst.applies(
                model, region
            ):
                rate *= burst.factor
        return rate

    def _requests(
        self,
        rng: np.random.Generator,
        times: npt.NDArray[np.float64],
        tiers: list[Tier],
        model: str,
        region: str,
        stream: int,
    ) -> list[tuple[float, int, SimRequest]]:
        names = sorted(self.apps)
        shares = np.array([self.apps[a].share for a in names])
        apps = rng.choice(len(names), size=len(times), p=shares / shares.sum())
        tenant_ids = rng.choice(
            self.tenants, size=len(times), p=zipf_shares(self.tenants, self.zipf_exponent)
        )
        inputs = np.zeros(len(times), dtype=np.int64)
        outputs = np.zeros(len(times), dtype=np.int64)
        for i, name in enumerate(names):
            mask = apps == i
            count = int(mask.sum())
            if count:
                inputs[mask] = self.apps[name].input.sample(rng, count)
                outputs[mask] = self.apps[name].output.sample(rng, count)
        tenant_names = self.tenant_names or [f"tenant-{i:02d}" for i in range(self.tenants)]
        return [
            (t, stream, SimRequest(t, model, region, tenant_names[k], i, o, tier, names[a]))
            for t, k, i, o, a, tier in zip(
                times.tolist(),
                tenant_ids.tolist(),
                inputs.tolist(),
                outputs.tolist(),
                apps.tolist(),
                tiers,
                strict=True,
            )
        ]
