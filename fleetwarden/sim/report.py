"""The report of a multi-strategy simulation: `summary.json`, per-run JSON, PNG plots, HTML.

Why one summary across strategies: the question a platform team asks is comparative (what would
LT-UA have cost us against what we run today, at what latency), so the summary puts every
strategy's figures side by side and states against `reactive` the figures SageServe's claims are
about. Why per-run files too: the time series (instances, utilisation, load against forecast,
per-minute) are a few MB a day, too much for the summary a person opens, but plots and later
analysis need them.

Everything written to `summary.json` and `runs/*.json` is a function of the runs' JSON and the
command's inputs (never of wall time, the output directory or the number of processes), with
sorted keys and floats rounded as `fleetwarden.sim.results` does: one seed, one file, byte for
byte.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetwarden.sim.conservation import conservation
from fleetwarden.sim.plan_inputs import forecast_model_counts
from fleetwarden.sim.results import _clean

INTERACTIVE = ("iw-f", "iw-n")
BASELINE = "reactive"
SCHEMA = 1
FLUID = "fluid"
FLUID_NOT_MODELLED = (
    "throttled_requests",
    "throttled_tokens",
    "abandoned_requests",
    "rejected",
    "jain_index",
    "tenants",
)
"""Figures a fluid run does not model (no tenants, no admission control, no per-request
tokens): null in the summary, never a zero that would read as measured."""
FLUID_TIER_NOT_MODELLED = (
    "throttled",
    "rejected",
    "pending",
    "pending_started",
    "ttft_lower_bound",
    "fluidity_hist",
    "fluidity_mean",
)
FLUID_NOTE = (
    "Fluid fidelity: tokens, not requests, move through the fleet in 60 s steps "
    "(fleetwarden.sim.fluid); request counts are tokens over the mean request size, and every "
    "request arriving in a step gets that step's TTFT (no spread within a step, so tails are "
    "flatter than request-level). Per-tenant service, Jain's index, throttling, rejections and "
    "the fluidity-index are not modelled: they are null here (n/m in the report), not zero."
)


@dataclass(frozen=True)
class ReportInputs:
    """What the command was asked to do, recorded in the summary and shown in the report."""

    fleet: Sequence[str]
    workload_kind: str
    workload_parameters: Mapping[str, Any]
    workload_notes: Sequence[str]
    hours: float
    seed: int
    planner: str
    scale: str
    """One or two sentences: what scale was simulated and why (shown at the top of the report)."""
    extra: Mapping[str, Any] = field(default_factory=dict)


def _mean_utilisation(samples: Mapping[str, list[list[Any]]]) -> dict[str, Any]:
    """Time-mean KV utilisation per endpoint, and over the fleet weighted by ready instances."""
    per: dict[str, float | None] = {}
    total = weight = 0.0
    for name, rows in sorted(samples.items()):
        values = [(r[4], r[1]) for r in rows if r[4] is not None]
        per[name] = sum(v for v, _ in values) / len(values) if values else None
        total += sum(v * n for v, n in values)
        weight += sum(n for _, n in values)
    return {"fleet": total / weight if weight else None, "endpoints": per}


def strategy_summary(run: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of one run that the summary keeps (the series stay in the run's file)."""
    totals = run["totals"]
    tiers = {
        name: {
            key: stats[key]
            for key in (
                "requests",
                "first_token",
                "completed",
                "throttled",
                "rejected",
                "pending",
                "pending_started",
                "ttft_target_s",
                "ttft_s",
                "ttft_covers",
                "ttft_lower_bound",
                "ttft_served_s",
                "e2e_s",
                "attainment",
                "attainment_served",
                "fluidity_hist",
                "fluidity_mean",
            )
            if key in stats
        }
        for name, stats in run["tiers"].items()
    }
    figures = {
        "fidelity": run["meta"]["fidelity"],
        "strategy": run["meta"]["strategy"],
        "scaling": run["meta"]["scaling"],
        "planner": run["meta"]["planner"],
        "forecast_models": forecast_model_counts(run["series"]["plans"]),
        "instance_hours": totals["instance_hours"],
        "gpu_hours": totals["gpu_hours"],
        "cost": totals["cost"],
        "cold_start_gpu_hours": totals["cold_start_gpu_hours"],
        "donated_instance_hours": totals["donated_instance_hours"],
        "launches": totals["launches"],
        "scale_out": totals["scale_out"],
        "scale_in": totals["scale_in"],
        "requests": totals["requests"],
        "completed": totals["completed"],
        "rejected": totals["rejected"],
        "spilled": totals["spilled"],
        "pending_at_end": totals["pending_at_end"],
        "throttled_requests": totals["throttled"],
        "throttled_tokens": totals["throttled_tokens"],
        "abandoned_requests": totals["abandoned"],
        "wasted_tokens": None,
        "tiers": tiers,
        "utilisation": _mean_utilisation(run["series"]["samples"]),
        "niw": run["niw"],
        "jain_index": run["jainIndex"],
        "tenants": run["tenants"],
        "endpoints": run["endpoints"],
    }
    for stats in tiers.values():
        # What share of the tier's arrivals got a first token within the run: next to the TTFT
        # percentiles, which leave throttled, rejected and abandoned requests out.
        stats["served_fraction"] = _ratio(stats.get("first_token"), stats["requests"])
        if not stats.get("ttft_served_s") and stats.get("ttft_covers", "served") == "served":
            stats["ttft_served_s"] = stats["ttft_s"]  # fluid: its TTFT covers served ones only
    if figures["fidelity"] == FLUID:
        for key in FLUID_NOT_MODELLED:
            figures[key] = None
        for stats in tiers.values():
            for key in FLUID_TIER_NOT_MODELLED:
                stats[key] = None
        figures["not_modelled"] = sorted(
            [*FLUID_NOT_MODELLED, *(f"tiers.{k}" for k in FLUID_TIER_NOT_MODELLED)]
        )
    figures["conservation"] = conservation(figures)
    return figures


def _ratio(value: Any, base: Any) -> float | None:
    if value is None or base is None or not base:
        return None
    return float(value) / float(base)


def comparison(strategies: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Each strategy against `reactive`: the figures of SageServe's claims (section 7)."""
    base = strategies.get(BASELINE)
    out: dict[str, Any] = {"baseline": BASELINE if base is not None else None}
    for name, figures in strategies.items():
        niw = figures["niw"]
        row: dict[str, Any] = {
            "gpu_hours": figures["gpu_hours"],
            "cold_start_gpu_hours": figures["cold_start_gpu_hours"],
            "niw_met_deadline": niw["met_deadline"],
            "niw_items": niw["items"],
            "niw_met_fraction": _ratio(niw["met_deadline"], niw["items"]),
            "niw_missed_deadline": niw["late"] + niw["pending_overdue"],
            "attainment": {t: figures["tiers"][t]["attainment"] for t in INTERACTIVE},
            "ttft_p95_s": {t: figures["tiers"][t]["ttft_s"].get("p95") for t in INTERACTIVE},
        }
        if base is not None:
            saving = _ratio(figures["gpu_hours"], base["gpu_hours"])
            row["gpu_hours_saving_vs_baseline"] = None if saving is None else 1 - saving
            row["cold_start_vs_baseline"] = _ratio(
                figures["cold_start_gpu_hours"], base["cold_start_gpu_hours"]
            )
            row["attainment_at_least_baseline"] = {
                t: _at_least(figures["tiers"][t]["attainment"], base["tiers"][t]["attainment"])
                for t in INTERACTIVE
            }
        out[name] = row
    return out


def _at_least(value: float | None, base: float | None) -> bool | None:
    if value is None or base is None:
        return None
    return round(value, 6) >= round(base, 6)


def build_summary(inputs: ReportInputs, runs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The document written to `summary.json`."""
    strategies = {name: strategy_summary(run) for name, run in runs.items()}
    fidelities = sorted({s["fidelity"] for s in strategies.values()})
    first = next(iter(runs.values()))
    body = {
        "schema": SCHEMA,
        "fidelity": fidelities[0] if len(fidelities) == 1 else fidelities,
        "fleet": list(inputs.fleet),
        "hours": inputs.hours,
        "seed": inputs.seed,
        "planner": inputs.planner,
        "scale": inputs.scale,
        "workload": {
            "kind": inputs.workload_kind,
            "parameters": dict(inputs.workload_parameters),
            "notes": list(inputs.workload_notes),
            "requests": first["totals"]["requests"],
            "placement": "synthetic",
        },
        "order": list(runs),
        "strategies": strategies,
        "comparison": comparison(strategies),
        "runs": {name: f"runs/{name}.json" for name in runs},
        "notes": [
            *(
                [FLUID_NOTE]
                if FLUID in fidelities
                else [
                    "wasted_tokens is not measured: the simulator does not track tokens served "
                    "to interactions that were throttled later (abandoned_requests counts the "
                    "requests dropped that way).",
                    "The fluidity-index takes each request's tokens after the first as evenly "
                    "spaced over its decode time (the engine model emits no per-token times).",
                ]
            ),
            *[f"{k}: {v}" for k, v in sorted(inputs.extra.items())],
        ],
    }
    cleaned: dict[str, Any] = _clean(body)
    return cleaned


def dumps(document: Mapping[str, Any]) -> str:
    """Deterministic JSON (sorted keys), indented for people."""
    return json.dumps(document, sort_keys=True, indent=1) + "\n"


def write_report(
    out: Path, inputs: ReportInputs, run_json: Mapping[str, str]
) -> tuple[dict[str, Any], Path]:
    """Write summary.json, runs/*.json, the plots and report.html; returns the summary and the
    report's path."""
    from fleetwarden.sim.report_html import render_html
    from fleetwarden.sim.report_plots import make_plots

    runs = {name: json.loads(text) for name, text in run_json.items()}
    summary = build_summary(inputs, runs)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    for name, text in run_json.items():
        (out / "runs" / f"{name}.json").write_text(text)
    (out / "summary.json").write_text(dumps(summary))
    plots = make_plots(runs, out)
    report = out / "report.html"
    report.write_text(render_html(summary, plots, out))
    return summary, report
