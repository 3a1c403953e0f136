"""The metric-name contract: every Prometheus name and label fleetwarden exports or reads.

This module is the single source. The sidecar exports these names, the operator and the batch
service query them, and the simulator writes simulated series under them, so a rename here is a
rename everywhere and a typo is a NameError instead of an empty PromQL result.
"""

from __future__ import annotations

from typing import Final

# Labels. `model` and `region` identify one serving Deployment (ModelDeployment x RegionPool).
MODEL: Final = "model"
REGION: Final = "region"
TENANT: Final = "tenant"
APP: Final = "app"
TIER: Final = "tier"
KIND: Final = "kind"  # token kind: "input" (prompt) or "output" (generated)
OUTCOME: Final = "outcome"  # request outcome, one of REQUEST_OUTCOMES

TOKEN_KINDS: Final = ("input", "output")
REQUEST_OUTCOMES: Final = (
    "served",  # completed normally
    "throttled",  # 429: rate limit, OIT, early rejection or full queue
    "cancelled",  # the client went away before completion
    "engine_error",  # 502 from the engine
    "timeout",  # 504: the engine did not answer in time
    # 400 for a refusal no retry can pass (prompt over a whole TPM limit), or an engine answer
    # below 500 other than 200. Requests refused before scheduling (bad JSON or field, bad
    # identity header, 413) are not counted under any outcome: they fail before their labels
    # (tenant, tier) are known.
    "invalid",
)

# Sidecar (one per serving pod). Counters carry the `_total` suffix in the exposition.
TOKENS: Final = "fleetwarden_tokens"  # counter {model, region, tenant, app, tier, kind}
REQUESTS: Final = "fleetwarden_requests"  # counter {model, region, tenant, app, tier, outcome}
QUEUE_DEPTH: Final = "fleetwarden_queue_depth"  # gauge {model, region}
IN_FLIGHT: Final = "fleetwarden_in_flight_requests"  # gauge {model, region}
KV_CACHE_UTILIZATION: Final = "fleetwarden_kv_cache_utilization"  # gauge {model, region}, 0..1
TTFT_SECONDS: Final = "fleetwarden_ttft_seconds"  # histogram {model, region, tier}
INTER_TOKEN_SECONDS: Final = "fleetwarden_inter_token_seconds"  # histogram {model, region}
QUEUE_WAIT_SECONDS: Final = "fleetwarden_queue_wait_seconds"  # histogram {model, region, tier}
FLUIDITY_INDEX: Final = "fleetwarden_fluidity_index"  # histogram {model, region, tier}
CONFIG_VERSION: Final = "fleetwarden_config_version"  # info-style gauge {model, region, version}

# Batch service (NIW).
NIW_BACKLOG_ITEMS: Final = "fleetwarden_niw_backlog_items"  # gauge {model, region}
NIW_OLDEST_AGE_SECONDS: Final = "fleetwarden_niw_oldest_age_seconds"  # gauge {model, region}
NIW_TOKENS: Final = "fleetwarden_niw_tokens"  # counter {model, region, kind}
NIW_ITEMS: Final = "fleetwarden_niw_items"  # counter {model, region, outcome in NIW_OUTCOMES}
NIW_IN_FLIGHT_ITEMS: Final = "fleetwarden_niw_in_flight_items"  # gauge {model, region}
NIW_BACKLOG_DUE_ITEMS: Final = "fleetwarden_niw_backlog_due_items"  # gauge {model, region, within}
WITHIN_SECONDS: Final = "within_seconds"  # label: queued items due within this many seconds
NIW_OUTCOMES: Final = (
    "completed",  # result written to the output file
    "failed",  # result written to the error file (engine error after retries, or not retryable)
    "retried",  # an attempt failed and the item waits for its backoff
    "stale",  # a duplicate dispatch's result, refused because the item was already settled
)

# The inference engine's own metrics (vLLM names; the colon is part of the name).
VLLM_KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"  # gauge, 0..1 (vLLM >= 0.10)
VLLM_GPU_CACHE_USAGE: Final = "vllm:gpu_cache_usage_perc"  # gauge, 0..1 (older vLLM)
VLLM_NUM_REQUESTS_RUNNING: Final = "vllm:num_requests_running"
VLLM_NUM_REQUESTS_WAITING: Final = "vllm:num_requests_waiting"
VLLM_PROMPT_TOKENS: Final = "vllm:prompt_tokens_total"
VLLM_GENERATION_TOKENS: Final = "vllm:generation_tokens_total"
VLLM_PREEMPTIONS: Final = "vllm:num_preemptions_total"
VLLM_KV_CACHE_NAMES: Final = (VLLM_KV_CACHE_USAGE, VLLM_GPU_CACHE_USAGE)  # preference order


def exposition_name(name: str) -> str:
    """The name as a Prometheus server stores it when scraped through a legacy-name exporter.

    Prometheus 2.x scraping `prometheus_client` >= 0.23 sees `vllm:x` as `vllm_x`; real vLLM keeps
    the colon. Queries that read engine metrics try both spellings.
    """
    return name.replace(":", "_")
