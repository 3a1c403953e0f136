"""The PromQL builders: exact query text, escaping and validation (no server needed).

That the queries mean what they say is tested against a real Prometheus in test_live.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.metrics import names, promql
from fleetwarden.metrics.promql import PromQLBuildError


def test_tokens_per_second_rates_then_sums_by_model_and_region() -> None:
    assert promql.tokens_per_second() == (
        'sum by (model, region) (rate(fleetwarden_tokens_total{tier!="niw"}[5m]))'
    )
    assert promql.tokens_per_second(model="llama", region="eu", kind="input", window="10m") == (
        'sum by (model, region) (rate(fleetwarden_tokens_total{kind="input",model="llama",'
        'region="eu",tier!="niw"}[10m]))'
    )


def test_niw_tokens_per_second() -> None:
    assert promql.niw_tokens_per_second(region="us", window="1h") == (
        'sum by (model, region) (rate(fleetwarden_niw_tokens_total{region="us"}[1h]))'
    )


def test_utilisation_prefers_the_sidecar_then_each_vllm_spelling() -> None:
    assert promql.UTILISATION_METRICS == (
        names.KV_CACHE_UTILIZATION,
        "vllm:kv_cache_usage_perc",
        "vllm_kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm_gpu_cache_usage_perc",
    )
    query = promql.utilisation(model="m")
    parts = query.split(" or ")
    assert parts == [
        f'avg by (model, region) ({m}{{model="m"}})' for m in promql.UTILISATION_METRICS
    ]


@pytest.mark.parametrize(
    ("value", "literal"),
    [
        ("plain", '"plain"'),
        ('say "hi"', r'"say \"hi\""'),
        ("C:\\models\\x", r'"C:\\models\\x"'),
        ("two\nlines\ttab\r", r'"two\nlines\ttab\r"'),
        ("bell\x07del\x7f", r'"bell\x07del\x7f"'),
        ("ünïcødé/模型", '"ünïcødé/模型"'),
        ("", '""'),
    ],
)
def test_string_literal_escapes(value: str, literal: str) -> None:
    assert promql.string_literal(value) == literal


@given(st.text())
@settings(max_examples=200, deadline=None)
def test_string_literal_never_ends_early(value: str) -> None:
    """Whatever the value, the literal is one token: the only unescaped quotes are its ends and
    it holds no raw line break (both would let text escape the string)."""
    literal = promql.string_literal(value)
    assert literal[0] == literal[-1] == '"'
    body, i = literal[1:-1], 0
    while i < len(body):
        assert body[i] not in '"\n\r'
        i += 2 if body[i] == "\\" else 1
    assert i == len(body)  # no dangling backslash escaping the closing quote


def test_injection_stays_inside_the_matcher() -> None:
    evil = 'x"} or vector(1) or up{a="'
    query = promql.tokens_per_second(model=evil)
    assert query.count("rate(") == 1
    assert r'model="x\"} or vector(1) or up{a=\""' in query


@pytest.mark.parametrize("label", ["bad-label", "1abc", "__name__", "a b", ""])
def test_label_names_are_validated(label: str) -> None:
    with pytest.raises(PromQLBuildError):
        promql.selector("up", {label: "x"})


@pytest.mark.parametrize("metric", ["bad-name", "a b", "up{}", ""])
def test_metric_names_are_validated(metric: str) -> None:
    with pytest.raises(PromQLBuildError):
        promql.selector(metric)


@pytest.mark.parametrize("window", ["5", "5 m", "5m]", "-5m", "1.5h", ""])
def test_windows_are_validated(window: str) -> None:
    with pytest.raises(PromQLBuildError):
        promql.tokens_per_second(window=window)


def test_kind_must_be_a_token_kind() -> None:
    with pytest.raises(PromQLBuildError):
        promql.tokens_per_second(kind="system")


def test_selector_is_canonical() -> None:
    """Sorted labels, None values dropped: equal inputs give byte-equal queries."""
    a = promql.selector("up", {"region": "r", "model": "m", "tier": None})
    b = promql.selector("up", {"model": "m", "region": "r"})
    assert a == b == 'up{model="m",region="r"}'
    assert promql.selector("vllm:kv_cache_usage_perc") == "vllm:kv_cache_usage_perc"
