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
  over the 50 largest clients (1.18 for m-large, 1.28 for m-mid). A model whose TenantPolicy
  names tenants gets them in the largest ranks (heaviest weight first, ties by name), anonymous
  tenants on the policy's defaults in the rest of `tenants` ranks, at least one (`TenantMix`).
  Its interactive requests carry no tier, so the policy gives each its tenant's tier as the
  sidecar does (a niw tenant sends none), not the TierMix's IW-F/IW-N split; NIW items come from
  every tenant with the niw tier set, as the batch service sends them.
- Level: the peak interactive demand of each (model, region) is `peak_fraction` of what its
  instances serve at `maxInstances` (tokens/s from the ModelDeployment's throughput), or given.

Arrivals are a Poisson process whose rate is constant per minute (`slot_s`) and follows the
cycles; each (stream, hour) has its own seeded generator, so a run's first hours do not depend on
its length. Bursts multiply the interactive rate of chosen models and regions for a while.
The request count is estimated and capped before any is drawn (`check_volume`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from fleetwarden.api.enums import Tier
from fleetwarden.sim.fleet_spec import Fleet, Model
from fleetwarden.sim.input_values import InputValueError, finite_number, whole_number
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
MAX_REQUESTS = 50_000_000
"""The most requests one run may generate: a week at the default sizing of `examples/` is about 30
million; per-request results beyond this need gigabytes per strategy (use fluid fidelity)."""
MAX_REQUESTS_PER_HOUR = 2_000_000
"""The most requests one hour may hold: an hour is generated and sorted at once, about 370 bytes
a request (0.7 GiB here); the example fleet's busiest hour at the default sizing is 0.26 million."""


class VolumeError(WorkloadError):
    """The workload would generate more requests than a cap allows (estimated before drawing)."""

    def __init__(self, estimate: float, cap: int, *, per_hour: bool) -> None:
        self.estimate = estimate
        self.cap = cap
        self.per_hour = per_hour
        where = "in its busiest hour" if per_hour else "in all"
        unit = " an hour" if per_hour else ""
        super().__init__(f"about {estimate:.3g} requests {where}, over the cap of {cap:,}{unit}")


@dataclass(frozen=True)
class TenantMix:
    """Who sends one model's requests (module docstring, Tenants): names largest first."""

    names: tuple[str, ...]
    shares: tuple[float, ...]
    """Each name's share of requests (1/rank^zipf_exponent, normalised)."""
    policy_tiers: tuple[Tier, ...] | None = None
    """Each name's tier in the TenantPolicy; None: no tenant named, tiers drawn per request."""

    def interactive(self) -> tuple[int, ...]:
        """Indices of the tenants that send interactive requests."""
        if self.policy_tiers is None:
            return tuple(range(len(self.names)))
        return tuple(i for i, tier in enumerate(self.policy_tiers) if tier is not Tier.NIW)


def _valid(name: str, value: object, *, above: bool = False, whole_from: int | None = None) -> None:
    """WorkloadError naming the parameter when `input_values` refuses its value."""
    try:
        if whole_from is None:
            finite_number(value, above=above)
        else:
            whole_number(value, minimum=whole_from)
    except InputValueError as exc:
        raise WorkloadError(f"{name} {exc}") from None


def _tenant_note(named: Mapping[str, Mapping[str, Any]]) -> str:
    """The report's sentence on tenants drawn from TenantPolicies (empty when none is)."""
    if not named:
        return ""
    who = "; ".join(
        f"{model}: {', '.join(info['named'])}, then {info['anonymous']} anonymous"
        for model, info in sorted(named.items())
    )
    return (
        f" Tenants, largest first, from the TenantPolicies ({who} on the policy's defaults): "
        "interactive requests get the tier the policy gives their tenant; NIW items come from "
        "every tenant."
    )


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
    """Names of the tenants, largest first; default tenant-00, tenant-01, ... (the anonymous
    tenants' names when a TenantPolicy names tenants, a policy's own names skipped)."""
    policy_tenants: bool = True
    """Draw a model's tenants from its TenantPolicy when it names any (module docstring)."""
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
        # NaN passes `< 0` and infinity reaches numpy's Poisson draw: both are refused
        _valid("duration_s", self.duration_s, above=True)
        _valid("slot_s", self.slot_s, above=True)
        _valid("rate_scale", self.rate_scale)
        _valid("peak_fraction", self.peak_fraction)
        for model, regions in (self.peak_tps or {}).items():
            for region, value in regions.items():
                _valid(f"peak_tps[{model}][{region}]", value)
        _valid("seed", self.seed, whole_from=0)
        _valid("tenants", self.tenants, whole_from=1)
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

    def check_volume(self, peaks: Mapping[tuple[str, str], float]) -> None:
        """VolumeError if the run (`peak_rates`) is expected to draw more than `MAX_REQUESTS`,
        or an hour more than `MAX_REQUESTS_PER_HOUR`; a NaN estimate fails too."""
        total, hour = self.expected_requests(peaks)
        if not hour <= MAX_REQUESTS_PER_HOUR:
            raise VolumeError(hour, MAX_REQUESTS_PER_HOUR, per_hour=True)
        if not total <= MAX_REQUESTS:
            raise VolumeError(total, MAX_REQUESTS, per_hour=False)

    def expected_requests(self, peaks: Mapping[tuple[str, str], float]) -> tuple[float, float]:
        """Requests over the run and in its busiest hour, without drawing one: the total from
        the weekly cycle at hour midpoints (bursts at its mean), the hour from the daily peak
        with every burst at once (a bound)."""
        f, n, niw = self.tiers.normalised()
        weekly_mean = (5 + 2 * WEEKEND_FACTOR) / 7
        peak_cycle = self.peak_cycle()
        hours, week = math.ceil(self.duration_s / HOUR_S), 168
        total = hour = 0.0
        for (model, region), peak in peaks.items():
            iw_mean = peak / peak_cycle
            niw_rate = iw_mean * weekly_mean * niw / (f + n) if f + n > 0 else 0.0
            profile = [self.cycle((h + 0.5) * HOUR_S, region) for h in range(week)]
            cycle_h = hours // week * sum(profile) + sum(profile[: hours % week])
            cycle_h -= (hours - self.duration_s / HOUR_S) * profile[(hours - 1) % week]
            total += iw_mean * cycle_h * HOUR_S + niw_rate * self.duration_s
            boost = 1.0
            for burst in self.bursts:
                if burst.applies(model, region):
                    start = max(burst.start_s, 0.0)
                    overlap = min(burst.start_s + burst.duration_s, self.duration_s) - start
                    total += iw_mean * weekly_mean * (burst.factor - 1) * max(overlap, 0.0)
                    boost *= max(burst.factor, 1.0)
            hour += (peak * boost + niw_rate) * min(HOUR_S, self.duration_s)
        return total, hour

    def tenant_mix(self, model: Model) -> TenantMix:
        """The tenants of `model`'s requests: its TenantPolicy's named tenants first, heaviest
        weight first, then anonymous ones (module docstring); `tenant-00`... if none is named,
        or if every named tenant and the defaults are NIW (interactive traffic needs a sender)."""
        named = model.fairness.tenants if self.policy_tenants else {}
        defaults = model.fairness.defaults
        if named and (
            defaults.tier is not Tier.NIW or any(t.tier is not Tier.NIW for t in named.values())
        ):
            ordered = sorted(named, key=lambda name: (-named[name].weight, name))
            anonymous = self._anonymous(max(self.tenants - len(ordered), 1), set(ordered))
            names = (*ordered, *anonymous)
            tiers = (*(named[name].tier for name in ordered), *([defaults.tier] * len(anonymous)))
            shares = zipf_shares(len(names), self.zipf_exponent)
            return TenantMix(names, tuple(shares.tolist()), tiers)
        names = tuple(self.tenant_names or [f"tenant-{i:02d}" for i in range(self.tenants)])
        return TenantMix(names, tuple(zipf_shares(self.tenants, self.zipf_exponent).tolist()))

    def _anonymous(self, count: int, taken: set[str]) -> list[str]:
        """`count` names from `tenant_names`, then tenant-NN, none of them in `taken`."""
        numbered = (f"tenant-{i:02d}" for i in itertools.count())
        pool, out = itertools.chain(self.tenant_names or (), numbered), list[str]()
        while len(out) < count:
            if (name := next(pool)) not in taken and name not in out:
                out.append(name)
        return out

    def fast_share(self, model: Model) -> float:
        """IW-F's share of `model`'s interactive requests: the tenants' when a TenantPolicy
        names them, else the TierMix's (what a rate model without requests needs to match)."""
        mix = self.tenant_mix(model)
        if mix.policy_tiers is None:
            f, n, _ = self.tiers.normalised()
            return f / (f + n) if f + n > 0 else 0.0
        chosen = mix.interactive()
        fast = sum(mix.shares[i] for i in chosen if mix.policy_tiers[i] is Tier.IW_FAST)
        return fast / sum(mix.shares[i] for i in chosen)

    # -- generation ------------------------------------------------------------------------------

    def build(self, fleet: Fleet) -> Workload:
        peaks = self.peak_rates(fleet)
        if self.peak_tps:
            unknown = {(m, r) for m, regions in self.peak_tps.items() for r in regions} - set(peaks)
            if unknown:
                raise WorkloadError(
                    f"peak_tps names (model, region) pairs the fleet lacks: {sorted(unknown)}"
                )
        mixes = {m.served_name: self.tenant_mix(m) for m in fleet.models.values()}
        named: dict[str, dict[str, Any]] = {}
        for m in fleet.models.values():
            mix = mixes[m.served_name]
            if mix.policy_tiers is not None:
                named[m.served_name] = {
                    "named": [t for t in mix.names if t in m.fairness.tenants],
                    "anonymous": sum(t not in m.fairness.tenants for t in mix.names),
                    "iwFastShare": round(self.fast_share(m), 6),
                }
        info = WorkloadInfo(
            kind="builtin",
            parameters={
                "durationSeconds": self.duration_s,
                "seed": self.seed,
                "peakRequestsPerSecond": {f"{m}/{r}": round(v, 6) for (m, r), v in peaks.items()},
                "tiers": dict(zip(("iw-f", "iw-n", "niw"), self.tiers.normalised(), strict=True)),
                "apps": {k: a.share for k, a in self.apps.items()},
                "tenants": self.tenants,
                **({"policyTenants": named} if named else {}),
                "diurnalDepth": self.diurnal_depth,
            },
            notes=(
                "Built-in workload: daily and weekly cycles from RAGPulse, lengths from Azure "
                "2023 and RAGPulse, tenant skew from ServeGen (module fleetwarden.sim."
                f"workload_builtin). {self._region_note(fleet)}{_tenant_note(named)}",
            ),
        )
        return Workload(info, lambda: self._generate(peaks, mixes))

    def _region_note(self, fleet: Fleet) -> str:
        """How each region's level was set: as given (--peak-instances), or by its capacity."""
        models = sorted({m.served_name for m in fleet.models.values()})
        given = [m for m in models if m in (self.peak_tps or {})]
        others = [m for m in models if m not in given]
        parts = [f"{self.peak_fraction:.0%} of its capacity at maxInstances"] if others else []
        if given:  # e.g. --peak-instances: N instances' tokens/s, whatever the region's size
            parts = [f"{p} ({', '.join(others)})" for p in parts]
            parts.insert(0, f"the tokens/s set for it, not by capacity ({', '.join(given)})")
        scale = f", times {self.rate_scale:g}" if self.rate_scale != 1 else ""
        return (
            "Regions are synthetic: each (model, region) gets its own traffic, its peak "
            f"interactive demand {' and '.join(parts)}{scale}."
        )

    def _generate(
        self, peaks: Mapping[tuple[str, str], float], mixes: Mapping[str, TenantMix]
    ) -> Iterator[SimRequest]:
        self.check_volume(peaks)
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
                chunk += self._hour(hour, index, model, region, iw_mean, niw_rate, mixes[model])
            chunk.sort(key=lambda e: (e[0], e[1]))
            yield from (request for _, _, request in chunk)

    def _hour(
        self,
        hour: int,
        stream: int,
        model: str,
        region: str,
        iw_mean: float,
        niw_rate: float,
        mix: TenantMix,
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
        senders: Sequence[int] = range(len(mix.names))
        for kind, rates in (("iw", iw), ("niw", np.full(len(slots), niw_rate))):
            counts = rng.poisson(rates * widths)
            total = int(counts.sum())
            if not total:
                continue
            times = np.repeat(slots, counts) + rng.random(total) * np.repeat(widths, counts)
            tiers: list[Tier | None]
            if kind == "niw":  # batch items: the batch service sets the tier, whoever sends them
                tiers, senders = [Tier.NIW] * total, range(len(mix.names))
            elif mix.policy_tiers is None:
                fast = rng.random(total) < (f / (f + n) if f + n > 0 else 0.0)
                tiers = [Tier.IW_FAST if x else Tier.IW_NORMAL for x in fast]
            else:  # the TenantPolicy gives each request its tenant's tier, as the sidecar does
                tiers, senders = [None] * total, mix.interactive()
            out += self._requests(rng, times, tiers, model, region, stream, mix, senders)
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
        tiers: list[Tier | None],
        model: str,
        region: str,
        stream: int,
        mix: TenantMix,
        senders: Sequence[int],
    ) -> list[tuple[float, int, SimRequest]]:
        names = sorted(self.apps)
        shares = np.array([self.apps[a].share for a in names])
        apps = rng.choice(len(names), size=len(times), p=shares / shares.sum())
        weights = np.array([mix.shares[i] for i in senders])
        drawn = rng.choice(len(senders), size=len(times), p=weights / weights.sum())
        tenant_names = [mix.names[i] for i in senders]
        inputs = np.zeros(len(times), dtype=np.int64)
        outputs = np.zeros(len(times), dtype=np.int64)
        for i, name in enumerate(names):
            mask = apps == i
            count = int(mask.sum())
            if count:
                inputs[mask] = self.apps[name].input.sample(rng, count)
                outputs[mask] = self.apps[name].output.sample(rng, count)
        return [
            (t, stream, SimRequest(t, model, region, tenant_names[k], i, o, tier, names[a]))
            for t, k, i, o, a, tier in zip(
                times.tolist(),
                drawn.tolist(),
                inputs.tolist(),
                outputs.tolist(),
                apps.tolist(),
                tiers,
                strict=True,
            )
        ]
