"""The interactive tokens/s series: batch (NIW) tokens are counted once, as the beta buffer.

Batch items go through the serving sidecar with tier `niw` and land in the same
`fleetwarden_tokens_total` counter as interactive requests (`tier="niw"`). The hourly planner
forecasts `promql.tokens_per_second` as *interactive* load and adds beta x the batch service's
own NIW counter on top (SageServe 6.3), and the metrics poller reads the same query as LT-UA's
observed load; so that query must leave the `niw` tier out.

The live tests run the planner's `plan_once` and the poller's `poll_once` unchanged against a real
Prometheus, backfilled with counters whose label sets are copied from what the real
`SidecarMetrics` exports for each tier. The counters are linear and sampled every 15 s from two
hours before the test to one hour after it, so `rate(...[5m])` at any moment of the test is the
rate exactly (the window always has samples within one interval of both its ends).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetwarden.metrics import names, promql
from fleetwarden.metrics.client import PrometheusClient
from fleetwarden.metrics.promql import PromQLBuildError
from fleetwarden.operator.autoscaler import Autoscaler
from fleetwarden.operator.fleet import FleetView, ObjectRecord
from fleetwarden.operator.hourly_planner import FleetPlanner, read_history, snapshot
from fleetwarden.operator.metrics_poller import MetricsPoller
from fleetwarden.operator.plan_status import PlanBook
from fleetwarden.sidecar.metrics import SidecarMetrics
from tests.support.prometheus_server import (
    PrometheusFactory,
    openmetrics_document,
    openmetrics_family,
)

MODEL, REGION, POOL, MD = "m-7b", "us-east", "east-a100", "llm/m"
TIER_TPS = {"iw-f": 1000.0, "iw-n": 500.0, "niw": 3000.0}
"""Tokens/s the sidecars count per tier; `niw` is batch work relayed by the sidecar."""
INTERACTIVE_TPS = TIER_TPS["iw-f"] + TIER_TPS["iw-n"]
BATCH_TPS = 2000.0
"""What the batch service's own `fleetwarden_niw_tokens_total` counts (deliberately not the
sidecar's `niw` tier rate, so the test tells which counter the beta buffer read)."""
THROUGHPUT = 1000.0
GRID_S = 15


# --- the query text ----------------------------------------------------------------------------


def test_tokens_per_second_leaves_the_niw_tier_out() -> None:
    assert promql.tokens_per_second() == (
        'sum by (model, region) (rate(fleetwarden_tokens_total{tier!="niw"}[5m]))'
    )
    assert promql.tokens_per_second(model="llama", region="eu", kind="input", window="10m") == (
        'sum by (model, region) (rate(fleetwarden_tokens_total{kind="input",model="llama",'
        'region="eu",tier!="niw"}[10m]))'
    )


def test_the_beta_history_reads_the_batch_counter_with_no_tier_filter() -> None:
    assert promql.niw_tokens_per_second(window="1h") == (
        "sum by (model, region) (rate(fleetwarden_niw_tokens_total[1h]))"
    )


def test_selector_not_equal_is_escaped_sorted_and_validated() -> None:
    query = promql.selector(
        "up", {"tier": "iw-n", "a": None}, not_equal={"tier": 'x"} or up{b="\\', "model": "m"}
    )
    assert query == r'up{model!="m",tier="iw-n",tier!="x\"} or up{b=\"\\"}'
    assert promql.selector("up", not_equal={"tier": None}) == "up"
    with pytest.raises(PromQLBuildError):
        promql.selector("up", not_equal={"bad-label": "x"})


# --- against a real Prometheus -------------------------------------------------------------------


def sidecar_token_labels() -> dict[str, dict[str, str]]:
    """Tier -> the label set the real sidecar exports on `fleetwarden_tokens_total` for tokens
    relayed at that tier (`niw`: a batch item, as relay.py counts it)."""
    metrics = SidecarMetrics(MODEL, REGION)
    metrics.count_tokens("acme", "chat", "iw-f", "output", 1)
    metrics.count_tokens("acme", None, "iw-n", "output", 1)
    metrics.count_tokens("batch-tenant", None, "niw", "output", 1)
    text = b"".join(metrics.exposition_slices()).decode()
    found: dict[str, dict[str, str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{names.TOKENS}_total":
                found[sample.labels[names.TIER]] = dict(sample.labels)
    assert set(found) == set(TIER_TPS), found
    return found


def history(start: float, end: float) -> str:
    """Linear counters per tier (as the sidecar labels them, plus the pod's scrape label), the
    batch service's NIW counter and a utilisation gauge, every GRID_S from `start` to `end`."""
    grid = [start + i * GRID_S for i in range(int((end - start) // GRID_S) + 1)]
    tokens = [
        ({**labels, "instance": "pod-0"}, [(t, TIER_TPS[tier] * (t - start)) for t in grid])
        for tier, labels in sidecar_token_labels().items()
    ]
    where = {names.MODEL: MODEL, names.REGION: REGION}
    batch = [({**where, names.KIND: "output"}, [(t, BATCH_TPS * (t - start)) for t in grid])]
    kv = [(where, [(t, 0.5) for t in grid])]
    return openmetrics_document(
        openmetrics_family(names.TOKENS, "counter", tokens),
        openmetrics_family(names.NIW_TOKENS, "counter", batch),
        openmetrics_family(names.KV_CACHE_UTILIZATION, "gauge", kv),
    )


def fleet() -> FleetView:
    """One RegionPool and one LT-UA ModelDeployment serving MODEL in it."""
    pool = {
        "apiVersion": "fleetwarden.dev/v1alpha1",
        "kind": "RegionPool",
        "metadata": {"name": POOL, "uid": "pool", "generation": 1},
        "spec": {"region": REGION, "gpuType": "A100", "capacity": {"gpus": 64}, "costPerHour": 2},
    }
    md: dict[str, Any] = {
        "apiVersion": "fleetwarden.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m", "namespace": "llm", "uid": "md", "generation": 1},
        "spec": {
            "model": {"name": "org/m-7b", "servedName": MODEL, "gpusPerInstance": 1},
            "throughput": {"A100": THROUGHPUT},
            "regions": [{"pool": POOL, "minInstances": 1, "maxInstances": 20}],
            "scaling": {"strategy": "lt-ua"},
        },
    }
    return FleetView.of(
        pools=[ObjectRecord.from_body(pool)], model_deployments=[ObjectRecord.from_body(md)]
    )


@dataclass(frozen=True)
class Live:
    client: PrometheusClient
    start: float


@pytest.fixture(scope="module")
def live(prometheus_factory: PrometheusFactory) -> Iterator[Live]:
    now = time.time()
    start = float(int(now - 2 * 3600) // GRID_S * GRID_S)
    server = prometheus_factory.start(history=history(start, now + 3600))
    with PrometheusClient(server.url, read_timeout_s=10.0) as client:
        yield Live(client, start)
    server.stop()


@pytest.mark.slow
def test_planner_history_is_interactive_and_beta_reads_batch_tokens(live: Live) -> None:
    now = time.time()
    (iw, niw) = read_history(live.client, snapshot(fleet()).specs, now)[(7, 300)]
    interactive = iw[(MODEL, REGION)]
    full_windows = [
        v
        for t, v in zip(interactive.timestamps(), interactive.values, strict=True)
        if t >= live.start + 300 + GRID_S and not math.isnan(v)
    ]
    assert len(full_windows) >= 12
    assert full_windows == pytest.approx([INTERACTIVE_TPS] * len(full_windows), rel=1e-9)
    assert list(niw[(MODEL, REGION)].values) == pytest.approx([BATCH_TPS] * 13, rel=1e-9)


@pytest.mark.slow
async def test_plan_counts_batch_tokens_once(live: Live) -> None:
    """r02: the plan is sized for interactive load + beta x NIW (1500 + 0.1 x 2000), not for a
    history that already holds the NIW tier (4500 + 200 tok/s: 5 instances instead of 2)."""
    autoscaler, book = Autoscaler(), PlanBook()
    planner = FleetPlanner(live.client, autoscaler, book, fleet, lambda key: None)
    try:
        assert await planner.plan_once()
    finally:
        planner.close()
    plan = autoscaler.plans[(MD, POOL)]
    assert plan.forecast_peak_tps == pytest.approx(INTERACTIVE_TPS + 0.1 * BATCH_TPS, rel=1e-6)
    assert plan.target == math.ceil((INTERACTIVE_TPS + 0.1 * BATCH_TPS) / THROUGHPUT)


@pytest.mark.slow
async def test_poller_load_for_lt_ua_is_interactive(live: Live) -> None:
    autoscaler = Autoscaler()
    poller = MetricsPoller(live.client, autoscaler, fleet, lambda key: None, rate_window="5m")
    assert await poller.poll_once()
    signal = autoscaler.signals[(MD, POOL)]
    assert signal.utilisation == pytest.approx(0.5)
    assert signal.load_tps == pytest.approx(INTERACTIVE_TPS, rel=1e-9)
