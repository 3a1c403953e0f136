"""The reference reading of an engine's `/metrics`: `prometheus_client`'s full text parser.

The sidecar's `parse_engine_metrics` scans only the sample lines it needs (a full parse of a real
vLLM exposition cost 12.5 ms on the event loop); the tests check it against this slow, complete
parse, which is what the sidecar used before.
"""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from fleetwarden.metrics import names
from fleetwarden.sidecar.engine_metrics import EngineReading

_KEYS = {
    names.VLLM_NUM_REQUESTS_WAITING: "waiting",
    names.VLLM_NUM_REQUESTS_RUNNING: "running",
    names.VLLM_KV_CACHE_USAGE: "kv",
    names.VLLM_GPU_CACHE_USAGE: "kv_old",
}
_KEYS.update({names.exposition_name(k): v for k, v in list(_KEYS.items())})


def reference_reading(text: str) -> EngineReading:
    """Sum the waiting/running samples, take the largest KV utilisation, after a full parse."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = _KEYS.get(sample.name)
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
