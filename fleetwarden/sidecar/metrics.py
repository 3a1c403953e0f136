"""The sidecar's own Prometheus metrics, under the names of `fleetwarden.metrics.names`.

Each sidecar has its own registry (no process globals), so tests can run several in one process
and `/metrics` shows exactly this sidecar. `model` and `region` are constant per pod and label
every series, which is what the operator's PromQL aggregates by.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from fleetwarden.metrics import names

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKEN_GAP_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5)
_FLUIDITY_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)


class SidecarMetrics:
    """Counters, gauges and histograms of one sidecar."""

    def __init__(self, model: str, region: str) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # `_created` series double the exposition and nobody reads them
        self.registry = CollectorRegistry(auto_describe=True)
        self.model, self.region = model, region
        where = (names.MODEL, names.REGION)
        self.tokens = Counter(
            names.TOKENS,
            "Tokens served, by tenant, application, tier and kind (input or output).",
            [*where, names.TENANT, names.APP, names.TIER, names.KIND],
            registry=self.registry,
        )
        self.requests = Counter(
            names.REQUESTS,
            "Requests by outcome (served, throttled, cancelled, engine_error, timeout, invalid).",
            [*where, names.TENANT, names.APP, names.TIER, names.OUTCOME],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            names.QUEUE_DEPTH,
            "Requests waiting in the sidecar's queue.",
            where,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            names.IN_FLIGHT,
            "Requests dispatched to the engine and not finished.",
            where,
            registry=self.registry,
        )
        self.kv_utilization = Gauge(
            names.KV_CACHE_UTILIZATION,
            "Engine KV-cache utilisation (0..1) from vllm:kv_cache_usage_perc.",
            where,
            registry=self.registry,
        )
        self.ttft = Histogram(
            names.TTFT_SECONDS,
            "Time from arrival at the sidecar to the first token.",
            [*where, names.TIER],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            names.QUEUE_WAIT_SECONDS,
            "Time a request waited in the sidecar's queue.",
            [*where, names.TIER],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.inter_token = Histogram(
            names.INTER_TOKEN_SECONDS,
            "Gaps between streamed tokens.",
            where,
            buckets=_TOKEN_GAP_BUCKETS,
            registry=self.registry,
        )
        self.fluidity = Histogram(
            names.FLUIDITY_INDEX,
            "Fluidity index of finished streamed requests (Etalon).",
            [*where, names.TIER],
            buckets=_FLUIDITY_BUCKETS,
            registry=self.registry,
        )
        self.config_version = Gauge(
            names.CONFIG_VERSION,
            "1 for the fairness config version in force.",
            [*where, "version"],
            registry=self.registry,
        )
        self._version: str | None = None
        # Labelled children cached per label tuple: `.labels()` costs microseconds per call.
        self._token_children: dict[tuple[str, str, str, str], Any] = {}
        self._request_children: dict[tuple[str, str, str, str], Any] = {}
        self.queue_depth_now = self.queue_depth.labels(model, region)
        self.in_flight_now = self.in_flight.labels(model, region)
        self.kv_now = self.kv_utilization.labels(model, region)
        self.inter_token_now = self.inter_token.labels(model, region)

    def set_config_version(self, version: str) -> None:
        if self._version is not None:
            self.config_version.remove(self.model, self.region, self._version)
        self.config_version.labels(self.model, self.region, version).set(1)
        self._version = version

    def count_tokens(self, tenant: str, app: str | None, tier: str, kind: str, n: int) -> None:
        if n > 0:
            key = (tenant, app or "", tier, kind)
            child = self._token_children.get(key)
            if child is None:
                child = self._token_children[key] = self.tokens.labels(
                    self.model, self.region, *key
                )
            child.inc(n)

    def count_request(self, tenant: str, app: str | None, tier: str, outcome: str) -> None:
        key = (tenant, app or "", tier, outcome)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(
                self.model, self.region, *key
            )
        child.inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
