"""`report.html`: one self-contained page (plots embedded as base64, no external assets), so it
can be mailed or attached to a ticket and still open anywhere.

The comparison table is also what the CLI prints (`table_rows`), so the terminal and the page
never disagree.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fleetwarden.sim.conservation import COLUMNS as ENDING_COLUMNS
from fleetwarden.sim.conservation import conservation_rows, imbalance_warning
from fleetwarden.sim.report_plots import Plot

COLUMNS = (
    "strategy",
    "GPU-h",
    "vs reactive",
    "cost",
    "cold-start GPU-h",
    "donated inst-h",
    "IW-F p95 TTFT",
    "IW-F served",
    "IW-F SLA",
    "IW-N p95 TTFT",
    "IW-N served",
    "IW-N SLA",
    "NIW done",
    "NIW late",
    "util",
    "Jain",
    "throttled tok",
)
CLI_COLUMNS = (
    "strategy",
    "GPU-h",
    "vs reactive",
    "cold-start GPU-h",
    "IW-F p95 TTFT",
    "IW-F served",
    "IW-F SLA",
    "IW-N p95 TTFT",
    "IW-N served",
    "IW-N SLA",
    "NIW done",
    "NIW late",
    "util",
)
"""The terminal's narrower table (the page has room for every column)."""


def _num(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _pct(value: Any, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value * 100:+.1f}%" if signed else f"{value * 100:.1f}%"


NOT_MODELLED = "n/m"
"""Shown for a figure the run's fidelity does not model (fluid: tenants, throttling), so an
absent figure never reads as a measured zero."""

FIDELITY_TEXT = {
    "request-level": "every request is an event; instances are event-driven continuous-batching "
    "engine models",
    "fluid": "per-minute token aggregates: no individual requests or tenants; request counts "
    "are tokens over the mean request size, TTFT has no spread within a minute; n/m marks "
    "figures it does not model",
}


def _cells(name: str, s: Mapping[str, Any], versus: Mapping[str, Any]) -> dict[str, str]:
    tiers, niw = s["tiers"], s["niw"]
    saving = versus.get("gpu_hours_saving_vs_baseline")
    fluid = s.get("fidelity") == "fluid"
    throttled = s["throttled_tokens"]
    return {
        "strategy": name,
        "GPU-h": _num(s["gpu_hours"]),
        "vs reactive": "-" if saving is None else _pct((-saving) or 0.0, signed=True),
        "cost": _num(s["cost"], 0),
        "cold-start GPU-h": _num(s["cold_start_gpu_hours"], 2),
        "donated inst-h": _num(s["donated_instance_hours"], 2),
        "IW-F p95 TTFT": _ttft(tiers["iw-f"], "p95"),
        "IW-F served": _pct(tiers["iw-f"].get("served_fraction")),
        "IW-F SLA": _pct(tiers["iw-f"]["attainment"]),
        "IW-N p95 TTFT": _ttft(tiers["iw-n"], "p95"),
        "IW-N served": _pct(tiers["iw-n"].get("served_fraction")),
        "IW-N SLA": _pct(tiers["iw-n"]["attainment"]),
        "NIW done": f"{niw['completed']:,}/{niw['items']:,}",
        "NIW late": f"{versus['niw_missed_deadline']:,}",
        "util": _pct(s["utilisation"]["fleet"]),
        "Jain": NOT_MODELLED if fluid else _num(s["jain_index"], 3),
        "throttled tok": NOT_MODELLED if throttled is None else f"{throttled:,}",
    }


def table_rows(summary: Mapping[str, Any], columns: Sequence[str] = COLUMNS) -> list[list[str]]:
    """One row of `columns` per strategy, in the order they were asked for."""
    rows = []
    for name in summary["order"]:
        cells = _cells(name, summary["strategies"][name], summary["comparison"][name])
        rows.append([cells[c] for c in columns])
    return rows


def _secs(value: Any) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _ttft(tier: Mapping[str, Any], percentile: str) -> str:
    """A TTFT percentile, ">=" when a wait censored at the end reaches it (a lower bound)."""
    text = _secs(tier["ttft_s"].get(percentile))
    return f">={text}" if percentile in (tier.get("ttft_lower_bound") or ()) else text


def _alarm(warning: str | None) -> list[str]:
    """The conservation check's failure, at the top of the page (nothing when it holds)."""
    if warning is None:
        return []
    style = "background:#fde8e8;border-left:6px solid #c00;padding:0.6em 1em;font-weight:bold"
    return [f"<p class='alarm' style='{style}'>WARNING: {html.escape(warning)}</p>"]


def _forecast_models(summary: Mapping[str, Any]) -> str:
    """Which forecast models made each strategy's plans (endpoint x round), so a short run's
    report cannot credit a forecaster that only ever fell back."""
    runs = [
        f"{html.escape(name)}: "
        + html.escape(", ".join(f"{m} {n:,}" for m, n in counts.items()) or "none recorded")
        for name in summary["order"]
        if (counts := summary["strategies"][name].get("forecast_models")) is not None
    ]
    if not runs:
        return ""
    return f"<p><b>Forecast models</b> (plans per endpoint and round): {'; '.join(runs)}.</p>"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _tier_rows(summary: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for name in summary["order"]:
        fluid = summary["strategies"][name].get("fidelity") == "fluid"
        for tier, t in summary["strategies"][name]["tiers"].items():
            rows.append(
                [
                    name,
                    tier,
                    f"{t['requests']:,}",
                    _pct(t.get("served_fraction")),
                    "-" if t.get("pending") is None else f"{t['pending']:,}",
                    *(_ttft(t, p) for p in ("p50", "p95", "p99")),
                    *(_secs(t["e2e_s"].get(p)) for p in ("p50", "p95", "p99")),
                    _pct(t.get("attainment")),
                    NOT_MODELLED if fluid else _num(t.get("fluidity_mean"), 3),
                ]
            )
    return rows


STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; }
.note { background: #f6f6f0; padding: 0.6em 1em; border-left: 4px solid #c9b458; }
figcaption { font-size: 14px; color: #444; margin-bottom: 2em; }
"""


def render_html(
    summary: Mapping[str, Any], plots: Sequence[Plot], directory: Path | None = None
) -> str:
    """The page; `directory` holds the PNGs to embed (default: the working directory)."""
    workload = summary["workload"]
    fidelities = summary["fidelity"]
    names = fidelities if isinstance(fidelities, list) else [fidelities]
    fidelity = "; ".join(
        f"<b>{html.escape(str(f))}</b> ({html.escape(FIDELITY_TEXT.get(str(f), ''))})"
        for f in names
    )
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        "<title>fleetwarden simulation report</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>fleetwarden simulation report</h1>",
        *_alarm(imbalance_warning(summary)),
        f"<p class='note'><b>Fidelity:</b> {fidelity}.</p>",
        f"<p class='note'><b>Scale.</b> {html.escape(summary['scale'])}</p>",
        "<p>",
        f"{summary['hours']:g} simulated hours, seed {summary['seed']}, planner "
        f"<b>{html.escape(summary['planner'])}</b>, fleet {html.escape(', '.join(summary['fleet']))}. ",
        f"Workload: <b>{html.escape(workload['kind'])}</b>, {workload['requests']:,} requests. ",
        "</p><ul>",
        *(f"<li>{html.escape(n)}</li>" for n in workload["notes"]),
        "</ul>",
        _forecast_models(summary),
        "<h2>Comparison</h2>",
        _table(COLUMNS, table_rows(summary)),
        "<p>GPU-hours count every instance from launch (it holds its GPUs) until it stops, "
        "including the model load; cold-start GPU-hours are the loading part. p95 TTFT: over "
        "the tier's requests admitted to the fleet, those that got a first token at their TTFT "
        "and those still waiting for one at the end at their wait so far (end - arrival); "
        "'>=' marks a percentile such a wait reaches, a lower bound of the true one. Throttled, "
        "rejected and abandoned requests got an answer, not a token: they are outside the "
        "percentiles. served: the share of the tier's arrivals (all of them) that got a first "
        "token within the run. SLA is the share of all of a tier's arrivals whose first token "
        "came within the tier's TTFT target (throttled, rejected, abandoned and unfinished "
        "requests count as misses). NIW done: items completed within "
        "the run, of all submitted; NIW late: items completed after their deadline or still "
        "waiting past it (items still waiting within their deadline are neither). util: KV "
        "utilisation averaged over ready instances and time. Jain: Jain's index over tenants' "
        "served/demanded tokens.</p>",
        "<h2>How requests ended</h2>",
        _table(ENDING_COLUMNS, conservation_rows(summary)),
        "<p>Every request that arrived ended one way: completed; throttled (answered 429 by its "
        "pod's rate limit or OIT); rejected (longer than the KV budget or max-model-len, or too "
        "large for an idle instance to admit); abandoned (an interactive request whose "
        "interaction had a request throttled before: the client gave up); or pending at the end "
        "(queued, running, waiting for an instance or for a NIW release; 'of which started' had "
        "its first token). The "
        "counts come from summary.json (per tier: requests, completed, throttled, rejected, "
        "pending; abandoned_requests); pending is counted where requests wait at the end, not "
        "as what is left over, so 'check' can fail: a row that does not add up means the "
        "simulator lost or double-counted requests. n/m: not modelled (fluid).</p>",
        "<h2>Latency per tier</h2>",
        _table(
            (
                "strategy",
                "tier",
                "requests",
                "served",
                "pending at end",
                "TTFT p50",
                "TTFT p95",
                "TTFT p99",
                "E2E p50",
                "E2E p95",
                "E2E p99",
                "SLA",
                "fluidity",
            ),
            _tier_rows(summary),
        ),
        "<p>fluidity: mean Etalon fluidity-index of completed requests (per-token deadlines from "
        "the tier's TTFT and TBT targets; tokens taken as evenly spaced within a request).</p>",
    ]
    for plot in plots:
        data = base64.b64encode(((directory or Path(".")) / plot.file).read_bytes()).decode()
        parts += [
            f"<h2>{html.escape(plot.title)}</h2><figure>",
            f"<img alt='{html.escape(plot.title)}' src='data:image/png;base64,{data}'>",
            f"<figcaption>{html.escape(plot.explanation)}</figcaption></figure>",
        ]
    parts += ["<h2>Notes</h2><ul>", *(f"<li>{html.escape(n)}</li>" for n in summary["notes"])]
    parts.append("</ul></body></html>\n")
    return "\n".join(parts)
