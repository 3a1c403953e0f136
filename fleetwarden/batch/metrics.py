"""The batch service's Prometheus metrics (names from `fleetwarden.metrics.names`).

Backlog, in-flight, oldest age and the deadline profile are gauges refreshed from the store by
the maintenance loop, so they are right after a restart; item outcomes and tokens are counters
of this process. The planner reads NIW tokens/s for its beta buffer (10% of last hour's NIW load).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from fleetwarden.batch.records import QueueBacklog, QueueKey, Settlement
from fleetwarden.metrics import names


class BatchMetrics:
    """Every NIW series of one service."""

    def __init__(
        self,
        queues: Iterable[QueueKey],
        due_buckets_s: Sequence[float],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        labels = (names.MODEL, names.REGION)
        self._backlog = Gauge(names.NIW_BACKLOG_ITEMS, "NIW items queued, waiting for capacity",
                              labels, registry=self.registry)  # fmt: skip
        self._in_flight = Gauge(names.NIW_IN_FLIGHT_ITEMS, "NIW items dispatched or waiting to "
                                "retry", labels, registry=self.registry)  # fmt: skip
        self._oldest = Gauge(names.NIW_OLDEST_AGE_SECONDS, "Age of the oldest queued NIW item",
                             labels, registry=self.registry)  # fmt: skip
        self._due = Gauge(names.NIW_BACKLOG_DUE_ITEMS, "Queued NIW items due within a horizon",
                          (*labels, names.WITHIN_SECONDS), registry=self.registry)  # fmt: skip
        self._tokens = Counter(names.NIW_TOKENS, "Tokens of completed NIW items",
                               (*labels, names.KIND), registry=self.registry)  # fmt: skip
        self._items = Counter(names.NIW_ITEMS, "NIW dispatch attempts by outcome",
                              (*labels, names.OUTCOME), registry=self.registry)  # fmt: skip
        self._due_buckets = tuple(due_buckets_s)
        self._known = set(queues)
        for queue in self._known:  # series exist (at zero) before the first item
            self._zero(queue)
            for outcome in names.NIW_OUTCOMES:
                self._items.labels(queue.model, queue.region, outcome)
            for kind in names.TOKEN_KINDS:
                self._tokens.labels(queue.model, queue.region, kind)

    def _zero(self, queue: QueueKey) -> None:
        for gauge in (self._backlog, self._in_flight, self._oldest):
            gauge.labels(queue.model, queue.region).set(0)
        for within in self._due_buckets:
            self._due.labels(queue.model, queue.region, f"{within:g}").set(0)

    def observe_backlog(self, snapshot: Mapping[QueueKey, QueueBacklog], now: float) -> None:
        """Set the gauges from a store snapshot; queues missing from it are empty."""
        self._known |= set(snapshot)
        for queue in self._known:
            backlog = snapshot.get(queue)
            if backlog is None:
                self._zero(queue)
                continue
            labels = (queue.model, queue.region)
            self._backlog.labels(*labels).set(backlog.queued)
            self._in_flight.labels(*labels).set(backlog.in_flight)
            oldest = backlog.oldest_created_at
            self._oldest.labels(*labels).set(0 if oldest is None else max(0.0, now - oldest))
            for within, count in backlog.due:
                self._due.labels(*labels, f"{within:g}").set(count)

    def settled(self, settlement: Settlement, applied: bool) -> None:
        """Count one settled dispatch attempt."""
        queue = settlement.item.queue
        result = settlement.result
        if not applied:
            outcome = "stale"
        elif result is None:
            outcome = "retried"
        else:
            outcome = "completed" if result.ok else "failed"
            if result.input_tokens:
                self._tokens.labels(queue.model, queue.region, "input").inc(result.input_tokens)
            if result.output_tokens:
                self._tokens.labels(queue.model, queue.region, "output").inc(result.output_tokens)
        self._items.labels(queue.model, queue.region, outcome).inc()

    def render(self) -> bytes:
        """The text exposition for /metrics."""
        return generate_latest(self.registry)
