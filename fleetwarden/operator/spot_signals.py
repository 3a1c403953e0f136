"""The NIW backlog per (model, region) as Prometheus last reported it: the spot sizing input.

The metrics poller reads it next to utilisation and load; the ModelDeployment reconcile turns it
into spot replicas. Kept apart from `Autoscaler.signals`, which are keyed by ModelDeployment and
pool, because the batch service labels its series by served model name and region, and one
backlog is shared by every ModelDeployment that serves that name there.

Failure rule, as for the serving replicas: a failed read writes nothing, the readings age out and
the reconcile then holds the spot replicas where they are. Scaling spot capacity to zero on
missing data would evict pods that are running NIW items.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field

from fleetwarden.metrics import names, promql
from fleetwarden.metrics.client import PrometheusClient, PrometheusError, Sample

log = logging.getLogger(__name__)

SeriesKey = tuple[str, str]
"""(served model name, region), the batch service's `{model, region}` labels."""


@dataclass(frozen=True)
class BacklogSignal:
    """One (model, region) queue at `observed_s`."""

    observed_s: float
    open_items: int
    """Queued plus in-flight items."""
    due: tuple[tuple[float, int], ...] = ()
    """Cumulative deadline profile: (within_s, items due within it)."""
    tokens_per_item: float | None = None
    """Mean tokens of a completed item over the rate window; None when nothing completed."""


@dataclass
class SpotSignals:
    """Latest backlog readings, kept across reconciles for the operator's life."""

    max_age_s: float = 120.0
    """Older readings are not acted on: the spot replicas hold."""
    backlog: dict[SeriesKey, BacklogSignal] = field(default_factory=dict)

    def fresh(self, model: str, region: str, now_s: float) -> BacklogSignal | None:
        """The reading for (model, region), or None when there is none or it is too old."""
        signal = self.backlog.get((model, region))
        if signal is None or now_s - signal.observed_s > self.max_age_s:
            return None
        return signal

    def record(self, readings: dict[SeriesKey, BacklogSignal] | None) -> None:
        """Store a poll's readings; None (a failed poll) changes nothing, so they age out.

        A pair missing from a successful poll has no reading either: the batch service exports
        zeros for every queue it knows, so a missing pair means it is not being scraped, and
        its spot replicas hold rather than drop.
        """
        if readings is not None:
            self.backlog = dict(readings)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _key(sample: Sample) -> SeriesKey | None:
    model, region = sample.labels.get(names.MODEL), sample.labels.get(names.REGION)
    return (model, region) if model is not None and region is not None else None


def backlog_from_samples(
    now_s: float,
    open_items: list[Sample],
    due_items: list[Sample],
    tokens_per_s: list[Sample],
    items_per_s: list[Sample],
) -> dict[SeriesKey, BacklogSignal]:
    """Join the four query results into one reading per (model, region) (pure)."""
    due: dict[SeriesKey, list[tuple[float, int]]] = {}
    for sample in due_items:
        key, within = _key(sample), sample.labels.get(names.WITHIN_SECONDS)
        value = _finite(sample.value)
        if key is None or within is None or value is None:
            continue
        try:
            horizon = float(within)
        except ValueError:
            continue
        due.setdefault(key, []).append((horizon, max(0, round(value))))
    tokens = {k: v for s in tokens_per_s if (k := _key(s)) and (v := _finite(s.value))}
    items = {k: v for s in items_per_s if (k := _key(s)) and (v := _finite(s.value))}
    readings: dict[SeriesKey, BacklogSignal] = {}
    for sample in open_items:
        key, value = _key(sample), _finite(sample.value)
        if key is None or value is None:
            continue
        per_item = None
        if items.get(key, 0.0) > 0 and tokens.get(key, 0.0) > 0:
            per_item = tokens[key] / items[key]
        readings[key] = BacklogSignal(
            now_s, max(0, round(value)), tuple(sorted(due.get(key, []))), per_item
        )
    return readings


async def read_backlog(
    client: PrometheusClient, now_s: float, window: str = promql.DEFAULT_RATE_WINDOW
) -> dict[SeriesKey, BacklogSignal] | None:
    """Every queue's backlog in four fleet-wide queries; None when Prometheus failed."""
    queries = (
        promql.niw_open_items(),
        promql.niw_backlog_due_items(),
        promql.niw_tokens_per_second(window=window),
        promql.niw_items_per_second(window=window),
    )
    try:
        results = [await asyncio.to_thread(client.instant, q) for q in queries]
    except PrometheusError as exc:
        log.warning("NIW backlog query failed (%s); spot replicas hold", exc)
        return None
    return backlog_from_samples(now_s, *results)
