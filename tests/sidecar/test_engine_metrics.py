"""The sidecar's reading of engine telemetry: the targeted scanner against a full parse.

`parse_engine_metrics` looks only at the four gauges the gate needs. These tests generate
expositions with `prometheus_client` itself (escaped label values, NaN and infinities, names that
extend a wanted name, histograms around them) and require the scanner to read exactly what
`prometheus_client`'s complete parser reads.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fleetwarden.sidecar.engine_metrics import (
    EngineReading,
    MalformedSampleError,
    parse_engine_metrics,
    sample_value,
)
from tests.support.engine_metrics_oracle import reference_reading

WANTED = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm_num_requests_waiting",
    "vllm_kv_cache_usage_perc",
)
label_values = st.text(alphabet=st.sampled_from('ab z"\\\n{},=#é'), min_size=0, max_size=12)
counts = st.integers(min_value=0, max_value=10_000).map(float)
fractions = st.one_of(
    st.floats(min_value=-0.5, max_value=1.5),
    st.sampled_from([math.nan, math.inf, -math.inf]),
)


@st.composite
def expositions(draw: st.DrawFn) -> str:
    """A vLLM-like exposition: some wanted gauges (per model), and look-alike neighbours."""
    registry = CollectorRegistry()
    for name in draw(st.lists(st.sampled_from(WANTED), unique=True, max_size=len(WANTED))):
        gauge = Gauge(name, "a wanted gauge", ["model_name", "engine"], registry=registry)
        values = fractions if "cache" in name else counts
        for model in draw(st.lists(label_values, unique=True, min_size=1, max_size=3)):
            gauge.labels(model, draw(label_values)).set(draw(values))
    if draw(st.booleans()):  # a longer name that starts with a wanted one
        by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason", "look-alike", ["reason"], registry=registry
        )
        by_reason.labels(draw(label_values)).set(draw(counts))
    if draw(st.booleans()):
        waits = Histogram(
            "vllm:num_requests_waiting_time_seconds", "look-alike histogram", registry=registry
        )
        for value in draw(st.lists(st.floats(0, 100), max_size=5)):
            waits.observe(value)
    if draw(st.booleans()):
        Counter("vllm:kv_cache_usage_perc_events", "look-alike", registry=registry).inc()
    return generate_latest(registry).decode()


@settings(max_examples=300, deadline=None)
@given(expositions())
def test_the_scanner_reads_what_the_full_parser_reads(text: str) -> None:
    assert parse_engine_metrics(text) == reference_reading(text)


def test_a_vllm_like_exposition_is_read() -> None:
    text = (
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="llama"} 3.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="llama"} 2.0\n'
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="llama",reason="capacity"} 9.0\n'
        'vllm:num_requests_running{engine="0",model_name="llama"} 7.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.75\n'
    )
    assert parse_engine_metrics(text) == EngineReading(waiting=5, running=7, kv_utilization=0.75)
    assert parse_engine_metrics(text.replace("\n", "\r\n")) == parse_engine_metrics(text)


def test_the_older_kv_gauge_is_the_fallback() -> None:
    text = "vllm:gpu_cache_usage_perc 0.5\nvllm:num_requests_waiting 1 1700000000000\n"
    assert parse_engine_metrics(text) == EngineReading(waiting=1, running=None, kv_utilization=0.5)


def test_labels_that_look_like_syntax_do_not_confuse_the_value() -> None:
    assert sample_value('{model_name="a} 1",x="\\\\"} 2.5') == 2.5
    assert sample_value('{model_name="say \\"hi\\" }"} +Inf 17') == math.inf
    assert sample_value(" 4e-1") == 0.4


def test_a_malformed_wanted_sample_makes_the_reading_unknown() -> None:
    """Half a reading is not trusted: the gate then treats the engine as saturated."""
    for line in (
        'vllm:num_requests_waiting{model_name="a"} many',
        'vllm:num_requests_waiting{model_name="a} 1',
        "vllm:num_requests_waiting{model_name=a 1",
        "vllm:num_requests_waiting 1 2 3",
        "vllm:num_requests_waiting",
    ):
        text = f"vllm:kv_cache_usage_perc 0.5\n{line}\n"
        assert parse_engine_metrics(text) == EngineReading(None, None, None), line


def test_a_malformed_line_of_another_metric_is_ignored() -> None:
    """Unlike a full parse, which gave up on the whole scrape for one bad histogram line."""
    text = "vllm:some_histogram_bucket{le=oops\nvllm:num_requests_waiting 2\n"
    assert parse_engine_metrics(text).waiting == 2


def test_sample_value_errors_are_typed() -> None:
    for rest in ("", "{", ' {a="1"}', '{a="1"} x'):
        try:
            sample_value(rest)
        except MalformedSampleError:
            continue
        raise AssertionError(f"{rest!r} was accepted")


def test_empty_and_unrelated_texts_have_no_reading() -> None:
    assert parse_engine_metrics("") == EngineReading(None, None, None)
    assert parse_engine_metrics("# just a comment\nprocess_cpu_seconds_total 3\n") == (
        EngineReading(None, None, None)
    )
