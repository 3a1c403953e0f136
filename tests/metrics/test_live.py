"""promql.py through client.py against a real Prometheus 2.42.

One server per module: two days of diurnal token counters per (model, region) backfilled with
promtool before start, plus two live exporters scraped every second (a sidecar and an engine)
for utilisation. The history is built so Prometheus' answer is known exactly: counters are the
closed-form integral of the rate, sampled on a 60 s grid, so `rate(...[5m])` at a grid time is
(I(t) - I(t - 300)) / 300 even across the counter reset planted in one pod.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, Gauge

from fleetwarden.metrics import names, promql
from fleetwarden.metrics.client import (
    PrometheusClient,
    PrometheusQueryError,
    PrometheusUnavailable,
    RetryPolicy,
)
from tests.support.prometheus_server import (
    MetricsExporter,
    PrometheusFactory,
    PrometheusServer,
    openmetrics_document,
    openmetrics_family,
)

pytestmark = pytest.mark.slow

DAY_S = 86_400.0
GRID_S = 60
HISTORY_S = 2 * 86_400 + 3_600
WEIRD = 'we"ird\\model\nname'  # a model name that would break a hand-formatted query


@dataclass(frozen=True)
class Load:
    """A diurnal tokens/s curve: base * (1 + 0.5 sin(2 pi t / day + phase)), t from `origin`."""

    model: str
    region: str
    base: float
    phase: float

    def rate(self, t: float) -> float:
        return self.base * (1 + 0.5 * math.sin(2 * math.pi * t / DAY_S + self.phase))

    def integral(self, t: float, origin: float) -> float:
        """Tokens served in [origin, t]."""
        w = 2 * math.pi / DAY_S
        cosine = math.cos(w * origin + self.phase) - math.cos(w * t + self.phase)
        return self.base * ((t - origin) + 0.5 * cosine / w)

    def mean_rate(self, start: float, end: float, origin: float) -> float:
        return (self.integral(end, origin) - self.integral(start, origin)) / (end - start)


LOADS = (
    Load("llama-70b", "eu-west", 1000.0, 0.0),
    Load("llama-70b", "us-east", 600.0, 2.0),
    Load("mistral-7b", "eu-west", 3000.0, 4.0),
    Load(WEIRD, "us-east", 50.0, 1.0),
)
POD_SHARES = {"pod-0": 0.6, "pod-1": 0.4}
KIND_SHARES = {"input": 0.7, "output": 0.3}
NIW_SHARE = 0.1


@dataclass(frozen=True)
class Live:
    server: PrometheusServer
    client: PrometheusClient
    origin: float
    end: float
    reset_s: float


def _kinds(load: Load) -> dict[str, float]:
    """Input/output split for the one load the kind filter is tested on; the rest is all input
    (fewer series keep promtool, which re-reads its input for every 2-hour block, quick)."""
    return KIND_SHARES if load.model == WEIRD else {"input": 1.0}


def _history(origin: float, end: float, reset_s: float) -> str:
    """Counters for every (load, pod, kind), plus NIW counters; pod-1 of the first load restarts
    right after the sample at `reset_s` (its counter starts again from zero)."""
    grid = [origin + i * GRID_S for i in range(int((end - origin) // GRID_S) + 1)]
    tokens = []
    for load in LOADS:
        for pod, pod_share in POD_SHARES.items():
            for kind, kind_share in _kinds(load).items():
                share = pod_share * kind_share
                restarts = load is LOADS[0] and pod == "pod-1"
                lost = share * load.integral(reset_s, origin) if restarts else 0.0
                samples = [
                    (t, share * load.integral(t, origin) - (lost if t > reset_s else 0.0))
                    for t in grid
                ]
                labels = {"model": load.model, "region": load.region, "pod": pod, "kind": kind}
                tokens.append((labels, samples))
    niw = [
        (
            {"model": load.model, "region": load.region, "kind": "input"},
            [(t, NIW_SHARE * load.integral(t, origin)) for t in grid],
        )
        for load in LOADS
    ]
    return openmetrics_document(
        openmetrics_family(names.TOKENS, "counter", tokens),
        openmetrics_family(names.NIW_TOKENS, "counter", niw),
    )


def _gauge(registry: CollectorRegistry, name: str) -> Gauge:
    return Gauge(name, "test gauge", ["model", "region", "pod"], registry=registry)


# Live utilisation per (model, region) and where it comes from.
EXPECTED_UTILISATION = {
    ("llama-70b", "eu-west"): 0.4,  # sidecar gauge, mean of 0.2 and 0.6; the engine's 0.99 loses
    ("llama-70b", "us-east"): 0.55,  # vllm:kv_cache_usage_perc, colon kept
    ("qwen-32b", "ap-south"): 0.33,  # vllm_kv_cache_usage_perc, legacy underscore spelling
    ("mistral-7b", "eu-west"): 0.15,  # vllm_gpu_cache_usage_perc (old vLLM, underscore)
    (WEIRD, "us-east"): 0.8,  # vllm:gpu_cache_usage_perc (old vLLM, colon)
}


@pytest.fixture(scope="module")
def live(prometheus_factory: PrometheusFactory) -> Iterator[Live]:
    end = float(int(time.time() - 600) // GRID_S * GRID_S)
    origin = end - HISTORY_S
    reset_s = origin + 30 * 3600
    sidecar, engine = CollectorRegistry(), CollectorRegistry()
    sidecar_kv = _gauge(sidecar, names.KV_CACHE_UTILIZATION)
    sidecar_kv.labels("llama-70b", "eu-west", "pod-0").set(0.2)
    sidecar_kv.labels("llama-70b", "eu-west", "pod-1").set(0.6)
    engine_kv = _gauge(engine, names.VLLM_KV_CACHE_USAGE)
    engine_kv.labels("llama-70b", "eu-west", "pod-0").set(0.99)
    engine_kv.labels("llama-70b", "us-east", "pod-0").set(0.55)
    legacy_kv = _gauge(engine, names.exposition_name(names.VLLM_KV_CACHE_USAGE))
    legacy_kv.labels("qwen-32b", "ap-south", "pod-0").set(0.33)
    old = _gauge(engine, names.exposition_name(names.VLLM_GPU_CACHE_USAGE))
    old.labels("mistral-7b", "eu-west", "pod-0").set(0.1)
    old.labels("mistral-7b", "eu-west", "pod-1").set(0.2)
    _gauge(engine, names.VLLM_GPU_CACHE_USAGE).labels(WEIRD, "us-east", "pod-0").set(0.8)
    with MetricsExporter(sidecar) as sidecar_exporter, MetricsExporter(engine) as engine_exporter:
        server = prometheus_factory.start(
            targets={"sidecar": [sidecar_exporter.address], "engine": [engine_exporter.address]},
            history=_history(origin, end, reset_s),
        )
        with PrometheusClient(server.url, read_timeout_s=10.0) as client:
            yield Live(server, client, origin, end, reset_s)
        server.stop()


def _by_deployment(labels: dict[str, str]) -> tuple[str, str]:
    assert set(labels) == {"model", "region"}, labels
    return labels["model"], labels["region"]


def test_tokens_per_second_per_model_and_region(live: Live) -> None:
    start = live.end - 12 * 3600
    series = live.client.range_series(promql.tokens_per_second(), start, live.end, 300.0)
    got = {_by_deployment(s.labels): s for s in series}
    assert set(got) == {(load.model, load.region) for load in LOADS}
    for load in LOADS:
        one = got[load.model, load.region]
        assert one.timestamps_s == tuple(start + 300.0 * i for i in range(145))
        expected = [load.mean_rate(t - 300, t, live.origin) for t in one.timestamps_s]
        assert list(one.values) == pytest.approx(expected, rel=1e-6)


def test_counter_reset_does_not_dent_the_rate(live: Live) -> None:
    """Windows straddling pod-1's restart still see the full rate (rate before sum)."""
    load = LOADS[0]
    query = promql.tokens_per_second(model=load.model, region=load.region)
    series = live.client.range_series(query, live.reset_s - 120, live.reset_s + 360, 60.0)
    (one,) = series
    expected = [load.mean_rate(t - 300, t, live.origin) for t in one.timestamps_s]
    assert list(one.values) == pytest.approx(expected, rel=1e-6)


def test_filters_and_kinds(live: Live) -> None:
    at = live.end - 3 * 3600
    load = LOADS[3]  # the weird name: quotes, backslash and newline go through escaping
    query = promql.tokens_per_second(model=load.model, region=load.region, kind="output")
    (sample,) = live.client.instant(query, at_s=at)
    assert _by_deployment(sample.labels) == (WEIRD, "us-east")
    assert sample.timestamp_s == at
    expected = KIND_SHARES["output"] * load.mean_rate(at - 300, at, live.origin)
    assert sample.value == pytest.approx(expected, rel=1e-6)


def test_niw_tokens_per_second_over_the_last_hour(live: Live) -> None:
    at = live.end - 600
    samples = live.client.instant(promql.niw_tokens_per_second(window="1h"), at_s=at)
    got = {_by_deployment(s.labels): s.value for s in samples}
    expected = {
        (load.model, load.region): NIW_SHARE * load.mean_rate(at - 3600, at, live.origin)
        for load in LOADS
    }
    assert got == pytest.approx(expected, rel=1e-6)


def test_long_range_is_fetched_in_pieces(live: Live) -> None:
    """Two days at a 15 s step is 11,521 points: more than Prometheus gives in one query."""
    start, end = live.end - 2 * 86_400, live.end
    load = LOADS[1]
    query = promql.tokens_per_second(model=load.model, region=load.region)
    (one,) = live.client.range_series(query, start, end, 15.0)
    assert len(one.timestamps_s) == 11_521
    assert one.timestamps_s == tuple(start + 15.0 * i for i in range(11_521))
    # Off-grid times see 5 samples, not 6, and Prometheus extrapolates: close, not exact.
    expected = [load.mean_rate(t - 300, t, live.origin) for t in one.timestamps_s]
    assert list(one.values) == pytest.approx(expected, rel=5e-3)


def test_utilisation_with_engine_fallbacks(live: Live) -> None:
    samples = live.client.instant(promql.utilisation())
    got = {_by_deployment(s.labels): s.value for s in samples}
    assert got == pytest.approx(EXPECTED_UTILISATION)


def test_utilisation_filter_escapes_the_name(live: Live) -> None:
    (sample,) = live.client.instant(promql.utilisation(model=WEIRD))
    assert _by_deployment(sample.labels) == (WEIRD, "us-east")
    assert sample.value == pytest.approx(0.8)


@pytest.mark.parametrize(
    "evil",
    ['x"} or vector(1) or up{a="', "x\\", '"', 'llama-70b" or model!="'],
)
def test_injection_matches_nothing(live: Live, evil: str) -> None:
    assert live.client.instant(promql.utilisation(model=evil)) == []
    assert live.client.instant(promql.tokens_per_second(region=evil), at_s=live.end) == []


def test_a_broken_query_is_a_query_error(live: Live) -> None:
    with pytest.raises(PrometheusQueryError, match="bad_data"):
        live.client.instant("sum by (model (up)")


@pytest.mark.timeout(60)
def test_stopped_prometheus_is_unavailable(prometheus_factory: PrometheusFactory) -> None:
    server = prometheus_factory.start()
    pauses: list[float] = []
    client = PrometheusClient(
        server.url,
        connect_timeout_s=1.0,
        read_timeout_s=1.0,
        retry=RetryPolicy(attempts=3, first_backoff_s=0.1),
        sleep=pauses.append,
    )
    assert client.instant("vector(1)")[0].value == 1.0
    server.stop()
    with pytest.raises(PrometheusUnavailable):
        client.instant("vector(1)")
    assert pauses == [0.1, 0.2]
