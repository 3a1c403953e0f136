"""Read the engine's Prometheus text: waiting and running requests, KV-cache utilisation.

vLLM publishes `vllm:kv_cache_usage_perc` (older releases `vllm:gpu_cache_usage_perc`), a fraction
in [0, 1] despite its name, and `vllm:num_requests_waiting`/`running`, one sample per served
model. A scrape without them is not an error the caller must handle: the fields are None, and the
capacity gate treats missing telemetry as saturated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from fleetwarden.metrics import names


@dataclass(frozen=True, slots=True)
class EngineReading:
    waiting: int | None
    running: int | None
    kv_utilization: float | None


_WANTED = {
    names.VLLM_NUM_REQUESTS_WAITING: "waiting",
    names.VLLM_NUM_REQUESTS_RUNNING: "running",
    names.VLLM_KV_CACHE_USAGE: "kv",
    names.VLLM_GPU_CACHE_USAGE: "kv_old",
}
_WANTED.update({names.exposition_name(k): v for k, v in list(_WANTED.items())})


def parse_engine_metrics(text: str) -> EngineReading:
    """Sum per-model samples of the waiting/running gauges; take the largest KV utilisation."""
    found: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError):
        return EngineReading(None, None, None)
    for family in families:
        for sample in family.samples:
            key = _WANTED.get(sample.name)
            if key is None or not math.isfinite(sample.value):
                continue
            if key in ("kv", "kv_old"):
                found[key] = max(found.get(key, 0.0), sample.value)
            else:
                found[key] = found.get(key, 0.0) + sample.value
    kv = found.get("kv", found.get("kv_old"))
    waiting, running = found.get("waiting"), found.get("running")
    return EngineReading(
        waiting=None if waiting is None else int(waiting),
        running=None if running is None else int(running),
        kv_utilization=None if kv is None else min(1.0, max(0.0, kv)),
    )
