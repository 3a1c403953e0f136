"""Close the books of a fluid run: the same `SimResults` shape as the request-level summary.

Kept apart from the fluid loop as `fleetwarden.sim.summary` is kept apart from the event loop.
Request counts are fluid (tokens over the mean request size) and rounded here; percentiles are
weighted by those counts. Tenants are not modelled: `tenants` is empty and Jain's index None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fleetwarden.api.enums import Tier
from fleetwarden.sim.results import CDF_POINTS, PERCENTILES, SimResults, TierStats
from fleetwarden.sim.summary import capacity_totals, run_meta, series_tables, tier_targets

if TYPE_CHECKING:
    from fleetwarden.sim.fluid import FluidSimulation


def weighted_quantiles(values: list[float], weights: list[float], qs: list[float]) -> list[float]:
    """Quantiles (0..1) of `values` where each counts `weights` times (inverted weighted CDF)."""
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    cumulative = np.cumsum(w)
    total = cumulative[-1]
    index = np.searchsorted(cumulative, np.asarray(qs) * total, side="left")
    return [float(v[min(i, len(v) - 1)]) for i in index]


def collect_fluid(sim: FluidSimulation, end: float) -> SimResults:
    for lane in sim.lanes.values():
        lane.endpoint.close(end)
    tiers: dict[str, TierStats] = {}
    targets = tier_targets(sim.fleet)
    for tier in Tier:
        stats = TierStats(ttft_target_s=targets[tier])
        stats.requests = round(sim._arrived[tier])
        stats.first_token = stats.completed = round(sim._served[tier])
        stats.within_target = round(sim._within[tier])
        values, weights = sim._ttft[tier]
        if values and sum(weights) > 0:
            qs = [p / 100 for p in PERCENTILES]
            stats.ttft_s = {
                f"p{p}": q
                for p, q in zip(PERCENTILES, weighted_quantiles(values, weights, qs), strict=True)
            }
            stats.ttft_cdf_s = weighted_quantiles(
                values, weights, list(np.linspace(0, 1, CDF_POINTS))
            )
            e2e, e2e_w = sim._e2e[tier]
            stats.e2e_s = {
                f"p{p}": q
                for p, q in zip(PERCENTILES, weighted_quantiles(e2e, e2e_w, qs), strict=True)
            }
        if tier is not Tier.NIW and sim._arrived[tier] > 0:
            stats.attainment = sim._within[tier] / sim._arrived[tier]
        if tier is not Tier.NIW and sim._served[tier] > 0:
            stats.attainment_served = sim._within[tier] / sim._served[tier]
        tiers[tier.value] = stats
    niw = sim.niw_stats
    items, completed, met, promoted = sim._niw_counts
    pending = overdue = 0.0
    for (model_key, _), queue in sim.niw.items():
        mean = sim.rates.lengths(sim.fleet.models[model_key].served_name).total
        for chunk in queue:
            pending += chunk[1] / mean
            overdue += chunk[1] / mean if chunk[2] < end else 0.0
    for lane in sim.lanes.values():
        mean = lane.service.input_tokens + lane.service.output_tokens
        for queue in lane.queues:
            for chunk in queue:
                if chunk[2] is not None:
                    pending += chunk[1] / mean
                    overdue += chunk[1] / mean if chunk[2] < end else 0.0
    niw.items, niw.completed, niw.met_deadline = round(items), round(completed), round(met)
    niw.late = round(completed - met)
    niw.pending, niw.pending_overdue, niw.promoted = round(pending), round(overdue), round(promoted)
    endpoints = {f"{k[0]}/{k[1]}": lane.endpoint.stats for k, lane in sim.lanes.items()}
    stats_list = list(endpoints.values())
    arrived = sum(t.requests for t in tiers.values())
    completed_all = sum(t.completed for t in tiers.values())
    totals = {
        **capacity_totals(stats_list),
        "requests": arrived,
        "completed": completed_all,
        "throttled": 0,
        "throttled_tokens": 0,
        "rejected": 0,
        "spilled": round(sim.spilled),
        "abandoned": 0,
        "pending_at_end": max(0, arrived - completed_all),
    }
    options = sim.options
    meta = run_meta(sim.fleet, options, sim.planner, end, "fluid")
    meta["stepSeconds"] = sim.step_s
    series = series_tables(sim.samples, sim.plans, sim.events)
    return SimResults(
        meta=meta,
        totals=totals,
        endpoints=endpoints,
        tiers=tiers,
        niw=niw,
        tenants={},
        series=series,
        jain_index=None,
    )
