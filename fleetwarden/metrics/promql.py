"""PromQL the operator and the planner run, built from the names in `names.py`.

Queries are built, never formatted by hand at call sites, for two reasons: the label names and
aggregation must match what the sidecar exports (one place to change), and label values come from
user objects (model, region and tenant names) that may contain quotes or backslashes. Every value
goes through `string_literal`, which escapes it as a PromQL string, and is matched with `=` or `!=`
(never the regex `=~`/`!~`), so a name can neither break the query nor inject into it. Label and
metric names cannot be escaped in PromQL; they are validated instead.

All per-(model, region) queries aggregate `by (model, region)`, so the result has one series per
serving Deployment, labelled exactly `{model, region}`, whichever metric answered.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from fleetwarden.api.enums import Tier
from fleetwarden.metrics import names

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_DURATION = re.compile(r"([0-9]+(ms|s|m|h|d|w|y))+")

DEFAULT_RATE_WINDOW = "5m"
"""Window of `rate()`: 5 minutes spans many scrapes at the usual 15-30 s interval and matches
the forecaster's 5-minute step. It must hold at least two samples of the series, so history
stored at a coarser step needs a wider window."""

UTILISATION_METRICS: tuple[str, ...] = (
    names.KV_CACHE_UTILIZATION,
    *(
        spelling
        for name in names.VLLM_KV_CACHE_NAMES
        for spelling in dict.fromkeys((name, names.exposition_name(name)))
    ),
)
"""Where utilisation is read from, in preference order: the sidecar's gauge, then the engine's
own gauge under each vLLM name, each with its colon (real vLLM scraped directly) and its
underscore spelling (re-exported through a legacy-name `prometheus_client`)."""

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class PromQLBuildError(ValueError):
    """A label name, metric name or duration that cannot appear in PromQL."""


def string_literal(value: str) -> str:
    """`value` as a double-quoted PromQL string literal that means exactly `value`.

    PromQL strings use Go's escape rules: backslash and the double quote are escaped, and so is
    every control character (a raw newline ends the lexer's string). Other characters, including
    any Unicode, stand for themselves.
    """
    out = []
    for char in value:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def label_name(name: str) -> str:
    """`name` if it is a valid Prometheus label name, else PromQLBuildError."""
    if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
        raise PromQLBuildError(f"not a usable label name: {name!r}")
    return name


def metric_name(name: str) -> str:
    """`name` if it is a valid Prometheus metric name (colons allowed), else PromQLBuildError."""
    if not _METRIC_NAME.fullmatch(name):
        raise PromQLBuildError(f"not a metric name: {name!r}")
    return name


def duration(window: str) -> str:
    """`window` if it is a PromQL duration such as `5m` or `1h30m`, else PromQLBuildError."""
    if not _DURATION.fullmatch(window):
        raise PromQLBuildError(f"not a PromQL duration: {window!r}")
    return window


def selector(
    metric: str,
    matchers: Mapping[str, str | None] | None = None,
    *,
    not_equal: Mapping[str, str | None] | None = None,
) -> str:
    """`metric{label="value",...,label!="value",...}`; None values are left out.

    `matchers` are exact equalities, `not_equal` exact inequalities (a series without the label
    has it empty, so `label!="x"` keeps it). Matchers are emitted sorted by label, `=` before `!=`,
    so equal inputs give byte-equal queries (cache keys, tests).
    """
    parts = sorted(
        (label_name(label), rank, op, string_literal(value))
        for rank, (op, given) in enumerate((("=", matchers), ("!=", not_equal)))
        for label, value in (given or {}).items()
        if value is not None
    )
    name = metric_name(metric)
    body = ",".join(f"{label}{op}{literal}" for label, _, op, literal in parts)
    return f"{name}{{{body}}}" if parts else name


def _by(labels: Iterable[str]) -> str:
    return "by (" + ", ".join(label_name(label) for label in labels) + ")"


_PER_DEPLOYMENT = (names.MODEL, names.REGION)


def _where(model: str | None, region: str | None, **more: str | None) -> dict[str, str | None]:
    return {names.MODEL: model, names.REGION: region, **more}


def tokens_per_second(
    *,
    model: str | None = None,
    region: str | None = None,
    kind: str | None = None,
    window: str = DEFAULT_RATE_WINDOW,
) -> str:
    """Interactive tokens/s served per (model, region): the load the forecaster and LT-UA read.

    Batch items pass through the sidecar too and are counted in the same counter with
    `tier="niw"`; they are left out here (`tier!="niw"`), because the plan adds NIW on its own as
    SageServe's beta buffer (from `niw_tokens_per_second`, the batch service's counter) and LT-UA
    compares this load with an interactive forecast: counting them here too would plan NIW twice
    and feed the plan's own batch traffic back into the next forecast. Items promoted to `iw-n`
    (near their deadline) carry no label that tells them from interactive `iw-n` requests and stay
    in (docs/forecasting.md, "Peak to plan for"). A series without a tier label is kept.

    `rate()` is taken per series before summing, so counter resets of single pods (restarts) are
    handled; summing first would turn every restart into a negative spike. `kind` restricts to
    "input" or "output" tokens (default: both).
    """
    if kind is not None and kind not in names.TOKEN_KINDS:
        raise PromQLBuildError(f"kind must be one of {names.TOKEN_KINDS}, got {kind!r}")
    series = selector(
        f"{names.TOKENS}_total",
        _where(model, region, **{names.KIND: kind}),
        not_equal={names.TIER: Tier.NIW.value},
    )
    return f"sum {_by(_PER_DEPLOYMENT)} (rate({series}[{duration(window)}]))"


def niw_tokens_per_second(
    *,
    model: str | None = None,
    region: str | None = None,
    kind: str | None = None,
    window: str = DEFAULT_RATE_WINDOW,
) -> str:
    """NIW (batch) tokens/s per (model, region), for the forecast's beta buffer (SageServe 6.3)."""
    if kind is not None and kind not in names.TOKEN_KINDS:
        raise PromQLBuildError(f"kind must be one of {names.TOKEN_KINDS}, got {kind!r}")
    series = selector(f"{names.NIW_TOKENS}_total", _where(model, region, **{names.KIND: kind}))
    return f"sum {_by(_PER_DEPLOYMENT)} (rate({series}[{duration(window)}]))"


def utilisation(
    *,
    model: str | None = None,
    region: str | None = None,
    metrics: Iterable[str] = UTILISATION_METRICS,
) -> str:
    """Mean KV-cache utilisation (0..1) per (model, region), with fallbacks.

    Each candidate metric is averaged by (model, region) and the candidates are joined with `or`,
    which keeps a (model, region) from the first metric that has it and fills in only the pairs it
    lacks from the next; so a region whose sidecars are not yet scraped still gets the engine's
    own gauge, and no pair is counted twice. The engine's gauges must carry `model` and `region`
    labels too (from the scrape target's labels; vLLM's own label is `model_name`).

    The mean of per-instance fractions is SageServe's "effective memory utilisation" (used over
    available KV memory, summed over instances) when instances are alike, as they are inside one
    Deployment.
    """
    where = _where(model, region)
    candidates = [f"avg {_by(_PER_DEPLOYMENT)} ({selector(m, where)})" for m in metrics]
    if not candidates:
        raise PromQLBuildError("utilisation needs at least one metric")
    return " or ".join(candidates)


def niw_open_items(*, model: str | None = None, region: str | None = None) -> str:
    """NIW items not yet finished (queued + in flight) per (model, region): the spot backlog.

    In-flight items count because a spot replica running them must not be scaled away. `max`,
    not `sum`: every batch replica of an HA (Redis) deployment exports the same store-wide
    gauges, so summing would count the backlog once per replica.
    """
    where = _where(model, region)
    queued = f"max {_by(_PER_DEPLOYMENT)} ({selector(names.NIW_BACKLOG_ITEMS, where)})"
    running = f"max {_by(_PER_DEPLOYMENT)} ({selector(names.NIW_IN_FLIGHT_ITEMS, where)})"
    return f"{queued} + {running}"


def niw_backlog_due_items(*, model: str | None = None, region: str | None = None) -> str:
    """The cumulative deadline profile per (model, region, within_seconds): queued NIW items due
    within each horizon (`max` for the same reason as `niw_open_items`)."""
    series = selector(names.NIW_BACKLOG_DUE_ITEMS, _where(model, region))
    return f"max {_by((*_PER_DEPLOYMENT, names.WITHIN_SECONDS))} ({series})"


def niw_items_per_second(
    *,
    model: str | None = None,
    region: str | None = None,
    outcome: str = "completed",
    window: str = DEFAULT_RATE_WINDOW,
) -> str:
    """NIW dispatch attempts/s per (model, region) with one outcome (default: completed items).

    With `niw_tokens_per_second` it gives the mean tokens of one item, which turns an
    instance's tokens/s into items/s when spot replicas are sized.
    """
    if outcome not in names.NIW_OUTCOMES:
        raise PromQLBuildError(f"outcome must be one of {names.NIW_OUTCOMES}, got {outcome!r}")
    series = selector(f"{names.NIW_ITEMS}_total", _where(model, region, **{names.OUTCOME: outcome}))
    return f"sum {_by(_PER_DEPLOYMENT)} (rate({series}[{duration(window)}]))"
