"""The sidecar's own Prometheus metrics, under the names of `fleetwarden.metrics.names`.

Each sidecar has its own registry (no process globals), so tests can run several in one process
and `/metrics` shows exactly this sidecar. `model` and `region` are constant per pod and label
every series, which is what the operator's PromQL aggregates by.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from fleetwarden.metrics import names
from fleetwarden.sidecar.metric_labels import TenantAppLabels
from fleetwarden.sidecar.tenant_counters import TenantCounters

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKEN_GAP_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5)
_FLUIDITY_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)


class LoopHistogram(Collector):
    """A histogram without labels beyond constant ones, observed only from the event loop.

    Why not prometheus_client's Histogram: its `observe` takes a lock and walks the buckets for
    every observation (about 2 us), and the inter-token gap is observed on every relayed read,
    the sidecar's hottest path. Observations and scrapes (`/metrics` is served by the same loop)
    all run on the event-loop thread, so plain ints need no lock, and every scrape shows exactly
    what was observed before it: nothing is batched, nothing lags. Same exposition as
    prometheus_client's (cumulative `_bucket` with `le`, `_count`, `_sum`).
    """

    def __init__(
        self, name: str, documentation: str, labels: dict[str, str], buckets: Sequence[float]
    ) -> None:
        self._name, self._documentation = name, documentation
        self._label_names, self._label_values = list(labels), list(labels.values())
        self._bounds = [float(b) for b in buckets]
        if self._bounds != sorted(self._bounds) or self._bounds[-1] == float("inf"):
            raise ValueError("buckets must be increasing and finite (+Inf is implicit)")
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self._sum = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound falls in that bucket (`le` is inclusive)
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._label_names)
        cumulative, buckets = 0, []
        for bound, count in zip([*self._bounds, float("inf")], self._counts, strict=True):
            cumulative += count
            le: str = floatToGoString(bound)  # type: ignore[no-untyped-call]  # untyped upstream
            buckets.append((le, float(cumulative)))
        family.add_metric(self._label_values, buckets, self._sum)
        yield family


class ReadingGauge(Collector):
    """One gauge series holding a reading the sidecar took from elsewhere (the engine's KV-cache
    utilisation), exported only while the sidecar has a reading and it is fresh.

    Why not prometheus_client's Gauge: a Gauge child exports 0.0 from the moment it exists, and
    its only "no value" is NaN, which turns every `avg` it enters into NaN. A pod whose engine is
    still loading the model has no reading, and one whose engine stopped answering has only a
    stale one; either way the series must be absent, not 0 or the last value. Prometheus scrapes
    not-ready pods too (endpoint discovery), so a 0.0 from a loading pod was averaged into
    `promql.utilisation()` as an idle instance; and a series that disappears from a scrape is
    marked stale by Prometheus at once, while a stale value would be believed for minutes.

    `set` is called by the dispatcher on every engine reading that carries a value (four times
    a second, never per token). Freshness is judged at each scrape (`expire_with`), by the same
    clock and bound as the capacity gate and `/readyz`, so no timer has to remove the series.
    """

    def __init__(self, name: str, documentation: str, labels: dict[str, str]) -> None:
        self._name, self._documentation = name, documentation
        self._label_names, self._label_values = list(labels), list(labels.values())
        self._value: float | None = None
        self._read_s = 0.0
        self._clock: Callable[[], float] = time.monotonic
        self._max_age_s: Callable[[], float] | None = None

    def expire_with(self, clock: Callable[[], float], max_age_s: Callable[[], float]) -> None:
        """Stop exporting a reading older than `max_age_s()` seconds by `clock`.

        `clock` is read at each `set` and scrape, `max_age_s` at each scrape, so a bound changed
        by a config push applies at once. Call it before the first `set` (a reading is stamped by the clock in force when
        it is set). Until it is called a reading never expires (it is still absent until set).
        """
        self._clock, self._max_age_s = clock, max_age_s

    def set(self, value: float) -> None:
        """A new reading, taken now. A non-finite one is no reading: it clears the series,
        since NaN or infinity in the exposition would poison every mean taken over it."""
        if math.isfinite(value):
            self._value, self._read_s = float(value), self._clock()
        else:
            self._value = None

    def clear(self) -> None:
        """Forget the reading: the series is absent until the next `set`."""
        self._value = None

    @property
    def value(self) -> float | None:
        """What a scrape exports now: the reading if there is one and it is fresh, else None."""
        if self._value is None:
            return None
        if self._max_age_s is not None and self._clock() - self._read_s > self._max_age_s():
            return None
        return self._value

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self._name, self._documentation, labels=self._label_names)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self._name, self._documentation, labels=self._label_names)
        value = self.value
        if value is not None:
            family.add_metric(self._label_values, value)
        yield family


class SidecarMetrics:
    """Counters, gauges and histograms of one sidecar."""

    def __init__(
        self,
        model: str,
        region: str,
        *,
        max_tenant_labels: int = 1000,
        max_app_labels: int = 100,
    ) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # `_created` series double the exposition and nobody reads them
        self.registry = CollectorRegistry(auto_describe=True)
        self.model, self.region = model, region
        where = (names.MODEL, names.REGION)
        # The per-tenant families are many series: kept outside the registry and rendered in
        # slices between turns of the event loop (`tenant_counters`).
        constant = {names.MODEL: model, names.REGION: region}
        self.tokens = TenantCounters(
            names.TOKENS,
            "Tokens served, by tenant, application, tier and kind (input or output).",
            constant,
            [names.TENANT, names.APP, names.TIER, names.KIND],
        )
        self.requests = TenantCounters(
            names.REQUESTS,
            "Requests by outcome (served, throttled, cancelled, engine_error, timeout, invalid).",
            constant,
            [names.TENANT, names.APP, names.TIER, names.OUTCOME],
        )
        self.labels = TenantAppLabels(max_tenant_labels, max_app_labels)
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
        # No sample until the engine's first reading, none once it is stale (`ReadingGauge`).
        self.kv_utilization = ReadingGauge(
            names.KV_CACHE_UTILIZATION,
            "Engine KV-cache utilisation (0..1) from vllm:kv_cache_usage_perc; absent while the"
            " engine has not answered (loading) or its last reading is stale.",
            constant,
        )
        self.registry.register(self.kv_utilization)
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
        self.inter_token = LoopHistogram(
            names.INTER_TOKEN_SECONDS,
            "Gaps between streamed tokens.",
            {names.MODEL: model, names.REGION: region},
            _TOKEN_GAP_BUCKETS,
        )
        self.registry.register(self.inter_token)
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
        self.queue_depth_now = self.queue_depth.labels(model, region)
        self.in_flight_now = self.in_flight.labels(model, region)
        self.kv_now = self.kv_utilization  # one series: model and region are constant
        self.inter_token_now = self.inter_token  # one series: model and region are constant
        # Per-tier histogram children, cached: `.labels()` costs microseconds per request.
        self._per_tier: dict[tuple[str, str], Any] = {}

    def set_config_version(self, version: str) -> None:
        if self._version is not None:
            self.config_version.remove(self.model, self.region, self._version)
        self.config_version.labels(self.model, self.region, version).set(1)
        self._version = version

    def name_known(self, tenants: Iterable[str], apps: Iterable[str]) -> None:
        """The config's tenants and applications: labelled by name, outside the budgets."""
        self.labels.configure(tenants, apps)

    def count_tokens(self, tenant: str, app: str | None, tier: str, kind: str, n: int) -> None:
        if n > 0:
            tenant_label, app_label = self.labels.labels(tenant, app or "")
            self.tokens.inc((tenant_label, app_label, tier, kind), n)

    def count_request(self, tenant: str, app: str | None, tier: str, outcome: str) -> None:
        tenant_label, app_label = self.labels.labels(tenant, app or "")
        self.requests.inc((tenant_label, app_label, tier, outcome))

    def _tier_child(self, family: str, histogram: Histogram, tier: str) -> Any:
        child = self._per_tier.get((family, tier))
        if child is None:
            child = self._per_tier[family, tier] = histogram.labels(self.model, self.region, tier)
        return child

    def observe_ttft(self, tier: str, seconds: float) -> None:
        self._tier_child("ttft", self.ttft, tier).observe(seconds)

    def observe_queue_wait(self, tier: str, seconds: float) -> None:
        self._tier_child("queue_wait", self.queue_wait, tier).observe(seconds)

    def observe_fluidity(self, tier: str, index: float) -> None:
        self._tier_child("fluidity", self.fluidity, tier).observe(index)

    def exposition_slices(self) -> Iterator[bytes]:
        """The whole exposition in pieces: the registry's small families at once, then the
        per-tenant families a slice at a time (the caller may yield to the loop between)."""
        yield generate_latest(self.registry)
        yield from self.tokens.slices()
        yield from self.requests.slices()
