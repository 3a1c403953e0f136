"""Days of diurnal tokens/s history as OpenMetrics counters, for backfilling a real Prometheus."""

from __future__ import annotations

import math
import random

from fleetwarden.metrics import names
from tests.support.prometheus_server import openmetrics_document, openmetrics_family

DAY_S = 86_400.0


def diurnal_tps(t: float, peak_at_s: float, low: float, high: float) -> float:
    """Tokens/s on a daily cosine, highest at `peak_at_s` (and every day at that time)."""
    phase = 2 * math.pi * (t - peak_at_s) / DAY_S
    return low + (high - low) * (1 + math.cos(phase)) / 2


def history_document(
    end_s: float,
    *,
    series: dict[tuple[str, str], tuple[float, float]],
    peak_at_s: float,
    days: float = 3.0,
    interval_s: float = 60.0,
    niw_tps: float = 2000.0,
    seed: int = 7,
) -> str:
    """Counters `fleetwarden_tokens_total` and `fleetwarden_niw_tokens_total` per (model, region)
    in `series` ((low, high) tokens/s), one sample per `interval_s` up to `end_s`, with 3% seeded
    noise on the rate so the forecaster has something to fit."""
    rng = random.Random(seed)
    start = end_s - days * DAY_S
    times = [start + i * interval_s for i in range(int(days * DAY_S / interval_s) + 1)]
    tokens, niw = [], []
    for (model, region), (low, high) in sorted(series.items()):
        total, samples, niw_samples = 0.0, [], []
        for t in times:
            rate = diurnal_tps(t, peak_at_s, low, high) * (1 + 0.03 * rng.uniform(-1, 1))
            total += rate * interval_s
            samples.append((t, round(total)))
            niw_samples.append((t, round((t - start) * niw_tps)))
        labels = {names.MODEL: model, names.REGION: region, names.KIND: "output"}
        tokens.append((labels, samples))
        niw.append((labels, niw_samples))
    return openmetrics_document(
        openmetrics_family(names.TOKENS, "counter", tokens),
        openmetrics_family(names.NIW_TOKENS, "counter", niw),
    )
