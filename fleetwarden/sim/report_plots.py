"""The report's PNG plots, drawn with matplotlib's Agg backend (no display needed).

Each plot answers one question of the comparison, and `PLOTS` carries the sentence the report
shows under it, so the explanation lives next to the code that draws the figure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HOUR = 3600.0
TOP_TENANTS = 8
PREFERRED = "lt-ua"
"""The strategy drawn where one run stands for all (per-tenant service, forecast)."""

Run = Mapping[str, Any]


@dataclass(frozen=True)
class Plot:
    """One written figure: its file name, title and the explanation shown under it."""

    file: str
    title: str
    explanation: str


def _columns(run: Run) -> dict[str, int]:
    return {name: i for i, name in enumerate(run["series"]["sampleColumns"])}


def _hours(rows: list[list[Any]]) -> list[float]:
    return [r[0] / HOUR for r in rows]


def _grid(count: int) -> tuple[Any, list[Any]]:
    cols = 2 if count > 1 else 1
    rows = (count + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 2.8 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def _one(runs: Mapping[str, Run]) -> tuple[str, Run]:
    name = PREFERRED if PREFERRED in runs else next(iter(runs))
    return name, runs[name]


def instances(runs: Mapping[str, Run], path: Path) -> None:
    endpoints = sorted(next(iter(runs.values()))["series"]["samples"])
    fig, axes = _grid(len(endpoints))
    for ax, endpoint in zip(axes, endpoints, strict=True):
        for name, run in runs.items():
            c = _columns(run)
            rows = run["series"]["samples"][endpoint]
            counts = [r[c["ready"]] + r[c["loading"]] for r in rows]
            ax.step(_hours(rows), counts, where="post", label=name, linewidth=1.2)
        ax.set_title(endpoint.split("/", 1)[1], fontsize=9)
        ax.set_xlabel("hour")
        ax.set_ylabel("instances")
    axes[0].legend(fontsize=8)
    _save(fig, path)


def utilisation(runs: Mapping[str, Run], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 3.5))
    for name, run in runs.items():
        c = _columns(run)
        samples = run["series"]["samples"]
        times = _hours(next(iter(samples.values())))
        means = []
        for i in range(len(times)):
            rows = [s[i] for s in samples.values() if i < len(s)]
            # An idle endpoint reads 0.0, a real reading: only a missing one (None) is left out,
            # as the summary table does; dropping the zeros made the plot read busier than it.
            used = [
                (r[c["utilisation"]], r[c["ready"]])
                for r in rows
                if r[c["utilisation"]] is not None
            ]
            ready = sum(n for _, n in used)
            means.append(sum(u * n for u, n in used) / ready if ready else 0.0)
        ax.plot(times, means, label=name, linewidth=1.0)
    ax.set_xlabel("hour")
    ax.set_ylabel("KV utilisation")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    _save(fig, path)


def covered_share(stats: Mapping[str, Any]) -> float:
    """The share of a tier's arrivals its TTFT quantiles cover: those with a first token, plus
    (request-level) those still waiting at the end, censored. The CDF is drawn against all
    arrivals, so throttled, rejected and abandoned requests are the gap under 1 and the height
    at the target line reads as SLA attainment."""
    requests = stats.get("requests") or 0
    if not requests:
        return 1.0
    covered = stats.get("first_token") or 0
    if stats.get("ttft_covers") == "admitted":
        covered += (stats.get("pending") or 0) - (stats.get("pending_started") or 0)
    return min(1.0, covered / requests)


def ttft_cdfs(runs: Mapping[str, Run], path: Path) -> None:
    tiers = ("iw-f", "iw-n", "niw")
    fig, axes = plt.subplots(1, len(tiers), figsize=(15, 3.5))
    for ax, tier in zip(axes, tiers, strict=True):
        target = None
        for name, run in runs.items():
            stats = run["tiers"][tier]
            cdf = stats.get("ttft_cdf_s") or []
            target = stats.get("ttft_target_s")
            if cdf:
                share = covered_share(stats)
                levels = [share * i / (len(cdf) - 1) for i in range(len(cdf))]
                ax.plot([max(v, 1e-3) for v in cdf], levels, label=name, linewidth=1.2)
        if target:
            ax.axvline(target, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_title(tier)
        ax.set_xlabel("TTFT (s)")
        ax.set_ylabel("fraction of arrived requests")
    axes[0].legend(fontsize=8)
    _save(fig, path)


def tenants(runs: Mapping[str, Run], path: Path) -> None:
    name, run = _one(runs)
    period = run["series"]["tenantPeriodSeconds"]
    table = run["tenants"]
    ranked = sorted(table, key=lambda t: (-table[t]["served_tokens"], t))
    top, rest = ranked[:TOP_TENANTS], ranked[TOP_TENANTS:]
    length = max((len(table[t]["served_tokens_by_period"]) for t in ranked), default=0)

    def padded(tenant: str) -> list[float]:
        served = table[tenant]["served_tokens_by_period"]
        return [served[i] / period if i < len(served) else 0.0 for i in range(length)]

    layers = [padded(t) for t in top]
    labels = list(top)
    if rest:
        others = [padded(t) for t in rest]
        layers.append([sum(col) for col in zip(*others, strict=True)])
        labels.append(f"{len(rest)} others")
    fig, ax = plt.subplots(figsize=(10, 3.5))
    if layers:
        ax.stackplot([i * period / HOUR for i in range(length)], layers, labels=labels, step="post")
        ax.legend(fontsize=7, ncol=3, loc="upper left")
    ax.set_title(f"served tokens/s per tenant ({name})", fontsize=9)
    ax.set_xlabel("hour")
    ax.set_ylabel("tokens/s")
    _save(fig, path)


def forecast(runs: Mapping[str, Run], path: Path) -> None:
    name, run = _one(runs)
    samples, plans = run["series"]["samples"], run["series"]["plans"]
    c = _columns(run)
    endpoints = sorted(samples)
    fig, axes = _grid(len(endpoints))
    for ax, endpoint in zip(axes, endpoints, strict=True):
        rows = samples[endpoint]
        ax.plot(_hours(rows), [r[c["demand_tps"]] or 0.0 for r in rows], label="actual", lw=0.8)
        plan = [p for p in plans.get(endpoint, []) if p[2] is not None]
        if plan:
            xs = [p[0] / HOUR for p in plan]
            ax.step(xs, [p[2] for p in plan], where="post", label="forecast", linewidth=1.4)
        ax.set_title(endpoint.split("/", 1)[1], fontsize=9)
        ax.set_xlabel("hour")
        ax.set_ylabel("tokens/s")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"interactive load against the planner's forecast ({name})", fontsize=10)
    _save(fig, path)


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


PLOTS: tuple[tuple[Plot, Callable[[Mapping[str, Run], Path], None]], ...] = (
    (
        Plot(
            "instances.png",
            "Instances over time",
            "Ready plus loading instances of every endpoint (model in a pool), per strategy. "
            "The area under each line is what the fleet pays for; a line rising an hour ahead "
            "of the load is the plan at work, a jagged one is reactive scaling chasing it.",
        ),
        instances,
    ),
    (
        Plot(
            "utilisation.png",
            "Utilisation",
            "KV-cache utilisation averaged over ready instances, per minute. Higher means less "
            "idle capacity; sustained values above the scale-out threshold mean queueing.",
        ),
        utilisation,
    ),
    (
        Plot(
            "ttft_cdf.png",
            "Time to first token",
            "Distribution of TTFT per tier (51 quantiles, log scale) as a fraction of all the "
            "tier's arrivals. Requests still waiting for a first token at the end are drawn at "
            "their wait so far (a lower bound of their TTFT, so the curve's upper part is an "
            "upper bound); throttled, rejected and abandoned requests never get one and are the "
            "gap below 1. The dashed line is the tier's TTFT target: the height where a curve "
            "crosses it is (about) the SLA attainment.",
        ),
        ttft_cdfs,
    ),
    (
        Plot(
            "tenants.png",
            "Per-tenant service",
            "Tokens/s served per tenant per hour (largest tenants, the rest summed), for one "
            "strategy. Flat bands under load mean the fairness policy held each tenant's share.",
        ),
        tenants,
    ),
    (
        Plot(
            "forecast.png",
            "Forecast against actual load",
            "Interactive tokens/s arriving at each endpoint (per minute) against the load the "
            "hourly planner sized the next hour for. The planner's target is this forecast "
            "divided by an instance's throughput.",
        ),
        forecast,
    ),
)


def make_plots(runs: Mapping[str, Run], out: Path) -> list[Plot]:
    """Draw every plot into `out`; returns them in report order."""
    written = []
    for plot, draw in PLOTS:
        if draw is tenants and not any(run["tenants"] for run in runs.values()):
            # fluid runs model no tenants: no figure rather than an empty one
            (out / plot.file).unlink(missing_ok=True)
            continue
        draw(runs, out / plot.file)
        written.append(plot)
    return written
