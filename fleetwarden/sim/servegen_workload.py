"""ServeGen regeneration: per-client request streams rebuilt from the released 10-minute windows.

ServeGen (Alibaba Bailian, `../shared/data/servegen/`) publishes, per client and 10-minute window,
the request rate, the inter-arrival CV and the fitted inter-arrival distribution (Gamma or
Weibull, parameters `pat_p1`, `pat_p2`), and per client and 6-hour window the quantiles of input
and output lengths. It publishes no requests, so they are regenerated here, seeded:

- Arrivals: per (client, window), a renewal process with the window's distribution, started at
  a uniform point of a first gap. Gamma's parameters are (shape, scale) and its mean gap matches
  the released rate; the fitted Weibull means do not (a median 23% off the rate, the fit weighs
  the tail), so both keep their fitted shape (hence the CV) and get the scale that makes the mean
  gap 1 / rate: the released rate is the count, the fit only says how bursty it is. Windows with
  a rate but no fit are Poisson.
- `fraction` scales every rate down (same shape: a client stays as bursty, only sparser).
- Lengths: per (client, 6-hour window), drawn through the released quantiles (p50, p90, p99,
  max) by `QuantileLength`. The 55 large clients without statistics, and fields a model lacks,
  use the mean quantiles of the model's known clients in that window.
- Collection gaps (windows where the whole model is near zero; 17 h in m-mid, 1 h in m-small)
  are detected with the forecaster's rule (`fleetwarden.forecasting.servegen`) and filled with
  the same window one day earlier (or later), because a simulated fleet would otherwise read
  them as idleness and scale down.
- A run past the data's end wraps around to its start (10 days for the language models).
- Each client is a tenant (`client-<id>`), placed in a region by a stable hash (`RegionRule`;
  the placement is synthetic) and given a tier by a stable hash (`TierMix`, default 42% IW-F,
  30% IW-N, 28% NIW of clients).

The data is read in place and never copied; `available()` says whether it is there.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow.parquet as pq

from fleetwarden.forecasting import servegen as sg
from fleetwarden.sim.fleet_spec import Fleet
from fleetwarden.sim.workload import (
    QuantileLength,
    RegionRule,
    SimRequest,
    TierMix,
    Workload,
    WorkloadError,
    WorkloadInfo,
)

DAY_S = 86_400
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def available(root: Path = sg.DEFAULT_ROOT) -> bool:
    """Whether the ServeGen rate and token files are present."""
    return (root / sg.RATES_FILE).is_file() and (root / sg.TOKENS_FILE).is_file()


@dataclass(frozen=True)
class Window:
    """One client's 10-minute window."""

    client: int
    t_s: int
    rate: float
    pattern: str
    p1: float
    p2: float


def gaps(rng: np.random.Generator, window: Window, rate: float, n: int) -> FloatArray:
    """`n` inter-arrival gaps with the window's shape and mean 1 / rate (module docstring)."""
    if window.pattern == "Gamma" and window.p1 > 0:
        shape = window.p1
        return rng.gamma(shape, 1.0 / (rate * shape), n)
    if window.pattern == "Weibull" and window.p1 > 0:
        shape = window.p1
        scale = 1.0 / (rate * math.gamma(1.0 + 1.0 / shape))
        return scale * rng.weibull(shape, n)
    return rng.exponential(1.0 / rate, n)


def arrivals(rng: np.random.Generator, window: Window, rate: float, length_s: float) -> FloatArray:
    """Arrival offsets within [0, length_s) of one window's renewal process."""
    expected = rate * length_s
    first = gaps(rng, window, rate, 1)[0] * rng.random()
    times = [np.array([first])]
    last = first
    while last < length_s:
        batch = np.cumsum(gaps(rng, window, rate, int(expected * 1.2) + 16)) + last
        times.append(batch)
        last = float(batch[-1])
    joined = np.concatenate(times)
    return joined[joined < length_s]


@dataclass(frozen=True)
class ServeGenWorkload:
    """Parameters of a ServeGen regeneration (module docstring)."""

    models: Mapping[str, str] | None = None
    """ServeGen model -> served model of the fleet; default: m-large, m-mid, m-small to the
    fleet's ModelDeployments in load order."""
    duration_s: float = float(DAY_S)
    start_s: float = 0.0
    """Where in ServeGen's 10 days to start (time 0 of the run)."""
    fraction: float = 0.01
    seed: int = 0
    tiers: TierMix = field(default_factory=TierMix)
    region_weights: Mapping[str, float] | None = None
    """Per region, for every model (default: equal over each model's regions)."""
    root: Path = sg.DEFAULT_ROOT

    def mapping(self, fleet: Fleet) -> dict[str, str]:
        if self.models is not None:
            for served in self.models.values():
                fleet.model(served)
            return dict(self.models)
        return dict(
            zip(sg.LANGUAGE_MODELS, (m.served_name for m in fleet.models.values()), strict=False)
        )

    def build(self, fleet: Fleet) -> Workload:
        if not available(self.root):
            raise WorkloadError(f"ServeGen data not found in {self.root} (see ../shared/data)")
        if not 0 < self.fraction <= 1:
            raise WorkloadError("fraction must be within (0, 1]")
        mapping = self.mapping(fleet)
        rules = {}
        for served in mapping.values():
            regions = fleet.model(served).regions
            weights = {r: (self.region_weights or {}).get(r, 1.0) for r in regions}
            rules[served] = RegionRule(weights)
        info = WorkloadInfo(
            kind="servegen",
            parameters={
                "models": mapping,
                "fraction": self.fraction,
                "startSeconds": self.start_s,
                "durationSeconds": self.duration_s,
                "seed": self.seed,
            },
            notes=(
                "ServeGen regeneration: arrivals and lengths regenerated per client and window "
                "from the released statistics (seeded). Region placement is synthetic: "
                + "; ".join(f"{m}: {rule.describe()}" for m, rule in rules.items()),
            ),
        )
        return Workload(info, lambda: self._generate(mapping, rules))

    def _generate(
        self, mapping: Mapping[str, str], rules: Mapping[str, RegionRule]
    ) -> Iterator[SimRequest]:
        streams = [
            ServeGenModelStream(self, index, source, served, rules[served])
            for index, (source, served) in enumerate(sorted(mapping.items()))
        ]
        first = int(self.start_s // sg.WINDOW_S)
        last = math.ceil((self.start_s + self.duration_s) / sg.WINDOW_S)
        for slot in range(first, last):
            chunk: list[tuple[float, int, SimRequest]] = []
            for stream in streams:
                chunk += stream.window(slot)
            chunk.sort(key=lambda e: (e[0], e[1]))
            yield from (request for _, _, request in chunk)


class ServeGenModelStream:
    """One ServeGen model's clients, window by window: the request-level generator draws
    arrivals from it, and the fluid rates (`fluid_rates.ServeGenRates`) read the same windows,
    so both fidelities see the same rates."""

    def __init__(
        self, spec: ServeGenWorkload, index: int, source: str, served: str, rule: RegionRule
    ) -> None:
        self.spec, self.index, self.source, self.served, self.rule = (
            spec,
            index,
            source,
            served,
            rule,
        )
        try:
            series = sg.load_model_series(source, root=spec.root).series
        except sg.ServeGenError as exc:
            raise WorkloadError(str(exc)) from exc
        self.gap = {
            int(series.start_s + i * series.step_s)
            for i, v in enumerate(series.values)
            if not math.isfinite(v)
        }
        self.span = int(series.start_s + len(series.values) * series.step_s)
        first = int(spec.start_s // sg.WINDOW_S)
        last = math.ceil((spec.start_s + spec.duration_s) / sg.WINDOW_S)
        needed = sorted(
            {self.source_window(slot * int(sg.WINDOW_S)) for slot in range(first, last)}
        )
        table = pq.read_table(
            spec.root / sg.RATES_FILE,
            columns=["client_id", "t_s", "rate_rps", "arrival_pat", "pat_p1", "pat_p2"],
            filters=[("model", "=", source), ("t_s", "in", needed), ("rate_rps", ">", 0.0)],
        )
        cols = table.to_pydict()
        self.windows: dict[int, list[Window]] = {}
        rows = zip(
            cols["client_id"],
            cols["t_s"],
            cols["rate_rps"],
            cols["arrival_pat"],
            cols["pat_p1"],
            cols["pat_p2"],
            strict=True,
        )
        for c, t, r, pat, p1, p2 in rows:
            self.windows.setdefault(int(t), []).append(
                Window(int(c), int(t), float(r), pat or "", p1 or 0.0, p2 or 0.0)
            )
        self.lengths = _Lengths(spec.root, source)

    def source_window(self, t_s: int) -> int:
        """The window whose rates stand for `t_s` (itself, or a day away across a gap)."""
        for shift in (0, -DAY_S, DAY_S, -2 * DAY_S, 2 * DAY_S):
            candidate = (t_s + shift) % self.span
            if candidate not in self.gap:
                return candidate
        return t_s % self.span

    def window(self, slot: int) -> list[tuple[float, int, SimRequest]]:
        spec = self.spec
        t_s = slot * int(sg.WINDOW_S)
        source = self.source_window(t_s)
        rng = np.random.default_rng([spec.seed, self.index, slot])
        out: list[tuple[float, int, SimRequest]] = []
        lo = spec.start_s - t_s
        hi = spec.start_s + spec.duration_s - t_s
        for window in self.windows.get(source, []):
            rate = window.rate * spec.fraction
            offsets = arrivals(rng, window, rate, sg.WINDOW_S)
            offsets = offsets[(offsets >= lo) & (offsets < hi)]
            if not offsets.size:
                continue
            key = f"{self.source}/{window.client}"
            inputs, outputs = self.lengths.sample(rng, window.client, source, offsets.size)
            region, tier = self.rule.region(key), spec.tiers.of_key(key)
            tenant = f"client-{window.client}"
            base = t_s - spec.start_s
            for offset, i, o in zip(
                offsets.tolist(), inputs.tolist(), outputs.tolist(), strict=True
            ):
                t = base + offset
                out.append(
                    (
                        t,
                        self.index,
                        SimRequest(t, self.served, region, tenant, int(i), int(o), tier=tier),
                    )
                )
        return out


class _Lengths:
    """Per (client, 6-hour window) length quantiles, with the fallbacks of the module docstring."""

    def __init__(self, root: Path, model: str) -> None:
        table = pq.read_table(
            root / sg.TOKENS_FILE,
            columns=["client_id", "t_s", "field", "p50", "p90", "p99", "max"],
            filters=[("model", "=", model), ("field", "in", ["input_tokens", "output_tokens"])],
        )
        self.known: dict[tuple[int, int, str], QuantileLength] = {}
        cols = table.to_pydict()
        rows = zip(
            cols["client_id"],
            cols["t_s"],
            cols["field"],
            cols["p50"],
            cols["p90"],
            cols["p99"],
            cols["max"],
            strict=True,
        )
        for c, t, f, p50, p90, p99, mx in rows:
            self.known[int(c), int(t), str(f)] = QuantileLength(p50, p90, p99, mx)
        self.fallback: dict[tuple[int, str], QuantileLength] = {}

    def _pooled(self, t: int, field_name: str) -> QuantileLength:
        cached = self.fallback.get((t, field_name))
        if cached is not None:
            return cached
        same = [q for (_, w, f), q in self.known.items() if w == t and f == field_name]
        if not same:
            same = [q for (_, _, f), q in self.known.items() if f == field_name]
        if not same:
            same = [QuantileLength(256, 1024, 4096, 8192)]
        pooled = QuantileLength(
            float(np.mean([q.p50 for q in same])),
            float(np.mean([q.p90 for q in same])),
            float(np.mean([q.p99 for q in same])),
            float(np.mean([q.max for q in same])),
        )
        self.fallback[t, field_name] = pooled
        return pooled

    def get(self, client: int, t_s: int, field_name: str) -> QuantileLength:
        window = t_s // sg.TOKEN_WINDOW_S * sg.TOKEN_WINDOW_S
        found = self.known.get((client, window, field_name))
        return found if found is not None else self._pooled(window, field_name)

    def sample(
        self, rng: np.random.Generator, client: int, t_s: int, n: int
    ) -> tuple[IntArray, IntArray]:
        return (
            self.get(client, t_s, "input_tokens").sample(rng, n),
            self.get(client, t_s, "output_tokens").sample(rng, n),
        )
