"""How requests ended, per strategy: arrived = completed + throttled + rejected + abandoned +
pending at the end, for interactive (IW-F and IW-N) and NIW requests, and whether that holds.

Why a check and not only a table: every other figure of the report (TTFT percentiles, SLA
attainment, served fractions) divides by or leaves out some of these counts, so a request lost
between them (dropped with a stopped instance, counted twice) would bias them silently. The
pending count is taken where requests wait at the end (`fleetwarden.sim.summary`), never as the
remainder, so the sum can fail; the report says so at its top when it does.

Abandoned requests (dropped because an earlier request of their interaction was throttled) are
interactive by construction: NIW items belong to no interaction. The simulator counts them for
the fleet, not per tier, so they are shown for IW-F and IW-N together.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GROUPS: dict[str, tuple[str, ...]] = {"IW": ("iw-f", "iw-n"), "NIW": ("niw",)}
"""Summary key: the tiers it adds up (shown as "IW-F + IW-N" and "NIW")."""
LABELS = {"IW": "IW-F + IW-N", "NIW": "NIW"}
ENDINGS = ("completed", "throttled", "rejected", "abandoned", "pending")
COLUMNS = (
    "strategy",
    "tiers",
    "arrived",
    "completed",
    "throttled",
    "rejected",
    "abandoned",
    "pending at end",
    "of which started",
    "check",
)
NOT_CHECKED = "not checked"


def _sum(tiers: Mapping[str, Mapping[str, Any]], names: tuple[str, ...], key: str) -> int | None:
    values: list[Any] = [tiers[n].get(key) for n in names if n in tiers]
    if not values or any(v is None for v in values):
        return None
    return sum(int(v) for v in values)


def conservation(figures: Mapping[str, Any]) -> dict[str, Any]:
    """Per group (IW, NIW) the arrivals and each ending from one strategy's summary figures
    (`fleetwarden.sim.report.strategy_summary`), `unaccounted` = arrived minus the endings, and
    `balanced`: True when every group adds up, False when one does not, None when a count is not
    modelled (fluid runs: no throttling, rejection or per-request pending) so nothing is checked."""
    tiers: Mapping[str, Mapping[str, Any]] = figures["tiers"]
    abandoned = figures.get("abandoned_requests")
    groups: dict[str, dict[str, int | None]] = {}
    for group, names in GROUPS.items():
        row: dict[str, int | None] = {"arrived": _sum(tiers, names, "requests")}
        for ending in ENDINGS:
            if ending == "abandoned":
                row[ending] = (abandoned if group == "IW" else 0) if abandoned is not None else None
            else:
                row[ending] = _sum(tiers, names, ending)
        row["pending_started"] = _sum(tiers, names, "pending_started")
        parts = [row[e] for e in ENDINGS]
        arrived = row["arrived"]
        row["unaccounted"] = (
            None
            if arrived is None or any(p is None for p in parts)
            else arrived - sum(p for p in parts if p is not None)
        )
        groups[group] = row
    unaccounted = [g["unaccounted"] for g in groups.values()]
    balanced = None if any(u is None for u in unaccounted) else all(u == 0 for u in unaccounted)
    return {"groups": groups, "balanced": balanced}


def _count(value: int | None) -> str:
    return "n/m" if value is None else f"{value:,}"


def _check(row: Mapping[str, int | None]) -> str:
    unaccounted = row["unaccounted"]
    if unaccounted is None:
        return NOT_CHECKED
    if unaccounted == 0:
        return "adds up"
    return f"DOES NOT ADD UP: {unaccounted:+,} unaccounted"


def conservation_rows(summary: Mapping[str, Any]) -> list[list[str]]:
    """The report's "How requests ended" table: one row per strategy and group (`COLUMNS`)."""
    rows = []
    for name in summary["order"]:
        books = summary["strategies"][name]["conservation"]
        for group, row in books["groups"].items():
            rows.append(
                [
                    name,
                    LABELS.get(group, group),
                    _count(row["arrived"]),
                    *(_count(row[e]) for e in ENDINGS),
                    _count(row["pending_started"]),
                    _check(row),
                ]
            )
    return rows


def imbalance_warning(summary: Mapping[str, Any]) -> str | None:
    """One sentence naming every strategy whose counts do not add up (None when all do or are
    not checked)."""
    broken = [
        f"{name} ({group}: {row['unaccounted']:+,})"
        for name in summary["order"]
        for group, row in summary["strategies"][name]["conservation"]["groups"].items()
        if row["unaccounted"] not in (None, 0)
    ]
    if not broken:
        return None
    return (
        "Request counts do not add up (arrived minus completed, throttled, rejected, abandoned "
        f"and pending at the end): {', '.join(broken)}. A simulator defect lost or double-counted "
        "requests; every percentile and SLA figure below is suspect."
    )
