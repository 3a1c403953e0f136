"""The KV gauge's lifecycle as a real Prometheus sees it through `promql.utilisation()`.

Two pods of one (model, region), each a real `SidecarMetrics` served as its `/metrics`: one whose
engine answered, one still loading. Prometheus scrapes both (as endpoint discovery scrapes
not-ready pods), and the region's utilisation is the ready pod's alone. When the ready pod's
reading goes stale its series leaves the scrape, Prometheus marks it stale at once, and the
query is empty (the operator holds) instead of answering the last value or a 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from fleetwarden.metrics import promql
from fleetwarden.metrics.client import PrometheusClient
from fleetwarden.sidecar.metrics import SidecarMetrics
from tests.support.prometheus_server import MetricsExporter, PrometheusFactory, prometheus_factory

__all__ = ["prometheus_factory"]
pytestmark = pytest.mark.slow


def wait_for(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached in {timeout_s:g} s")
        time.sleep(0.1)


def test_loading_pods_are_not_averaged_and_stale_readings_vanish(
    prometheus_factory: PrometheusFactory,
) -> None:
    ahead = [0.0]  # how far the pods' clock is moved past the real one

    def clock() -> float:
        return time.monotonic() + ahead[0]

    ready, loading = SidecarMetrics("llama", "eu"), SidecarMetrics("llama", "eu")
    ready.kv_now.set(0.9)
    query = promql.utilisation(model="llama", region="eu")
    with (
        MetricsExporter(ready.registry) as pod_a,
        MetricsExporter(loading.registry) as pod_b,
    ):
        server = prometheus_factory.start(targets={"sidecars": [pod_a.address, pod_b.address]})
        with PrometheusClient(server.url, read_timeout_s=10.0) as client:
            (sample,) = client.instant(query)
            assert sample.value == pytest.approx(0.9)  # not 0.45: the loading pod is not idle

            # The ready pod's engine goes silent past the bound (the sidecar's poller binds the
            # gate's bound; the default clock is time.monotonic).
            ready.kv_now.expire_with(clock, lambda: 5.0)
            ahead[0] = 5.5
            wait_for(lambda: client.instant(query) == [])
        server.stop()
