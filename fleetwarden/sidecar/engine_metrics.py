"""Read the engine's Prometheus text: waiting and running requests, KV-cache utilisation.

vLLM publishes `vllm:kv_cache_usage_perc` (older releases `vllm:gpu_cache_usage_perc`), a fraction
in [0, 1] despite its name, and `vllm:num_requests_waiting`/`running`, one sample per served
model. A scrape without them is not an error the caller must handle: the fields are None, and the
capacity gate treats missing telemetry as saturated.

Why a scanner and not `prometheus_client`'s parser: a real vLLM `/metrics` is about 600 lines
(57 KB: histograms of every latency, plus process metrics), and parsing all of it took 12.5 ms
here, on the sidecar's event loop, four times a second: every request that arrived meanwhile
waited that long for its first byte. Only four gauges matter, so the text is searched for their
sample lines (`str.find`, no per-line work) and only those are decoded: about 0.1 ms. The syntax
of a sample line is the exposition format's (`name{label="value",...} value [timestamp]`, label
values with `\\"`, `\\\\` and `\\n` escapes, `NaN`/`+Inf`); a wanted sample that does not follow
it makes the whole reading unknown, as an unparseable scrape did before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from fleetwarden.metrics import names


@dataclass(frozen=True, slots=True)
class EngineReading:
    waiting: int | None
    running: int | None
    kv_utilization: float | None


_UNKNOWN = EngineReading(None, None, None)
GAUGE_KEYS = {
    names.VLLM_NUM_REQUESTS_WAITING: "waiting",
    names.VLLM_NUM_REQUESTS_RUNNING: "running",
    names.VLLM_KV_CACHE_USAGE: "kv",
    names.VLLM_GPU_CACHE_USAGE: "kv_old",
}
GAUGE_KEYS.update({names.exposition_name(k): v for k, v in list(GAUGE_KEYS.items())})
"""The gauges read, in both spellings, and what each one is."""
_AFTER_NAME = ("{", " ", "\t")


class MalformedSampleError(ValueError):
    """A wanted metric's sample line does not follow the exposition format."""


def _end_of_labels(line: str) -> int:
    """Index just past the `}` closing the label set that `line` opens with `{`."""
    pos = 1
    while True:
        brace, quote = line.find("}", pos), line.find('"', pos)
        if brace < 0:
            raise MalformedSampleError("unterminated label set")
        if quote < 0 or brace < quote:
            return brace + 1
        pos = quote + 1
        while True:  # to the closing quote: one not escaped by an odd run of backslashes
            close = line.find('"', pos)
            if close < 0:
                raise MalformedSampleError("unterminated label value")
            slashes = 0
            while line[close - 1 - slashes] == "\\":
                slashes += 1
            pos = close + 1
            if slashes % 2 == 0:
                break


def sample_value(rest: str) -> float:
    """The value of a sample line, given what follows its metric name."""
    if rest.startswith("{"):
        rest = rest[_end_of_labels(rest) :]
    fields = rest.split()
    if not fields or len(fields) > 2:
        raise MalformedSampleError(
            f"expected a value and an optional timestamp, got {rest.strip()!r}"
        )
    try:
        return float(fields[0])
    except ValueError:
        raise MalformedSampleError(f"not a number: {fields[0]!r}") from None


def _samples(text: str, name: str) -> list[float]:
    """Values of every sample line of the metric `name` (not of longer names it prefixes)."""
    needle = "\n" + name
    values: list[float] = []
    start = 0
    while (at := text.find(needle, start)) >= 0:
        begin = at + len(needle)
        end = text.find("\n", begin)
        if end < 0:
            end = len(text)
        start = end
        rest = text[begin:end]
        if rest.startswith(_AFTER_NAME) or not rest.strip():  # a bare name: malformed
            values.append(sample_value(rest))
    return values


def reading_from(samples: Iterable[tuple[str, float]]) -> EngineReading:
    """Sum per-model samples of the waiting/running gauges; take the largest KV utilisation.

    Samples of other metrics and non-finite values are skipped."""
    found: dict[str, float] = {}
    for name, value in samples:
        key = GAUGE_KEYS.get(name)
        if key is None or not math.isfinite(value):
            continue
        if key in ("kv", "kv_old"):
            found[key] = max(found.get(key, 0.0), value)
        else:
            found[key] = found.get(key, 0.0) + value
    kv = found.get("kv", found.get("kv_old"))
    waiting, running = found.get("waiting"), found.get("running")
    return EngineReading(
        waiting=None if waiting is None else int(waiting),
        running=None if running is None else int(running),
        kv_utilization=None if kv is None else min(1.0, max(0.0, kv)),
    )


def parse_engine_metrics(text: str) -> EngineReading:
    """The reading of an exposition, from the sample lines of the wanted gauges only."""
    text = "\n" + text  # every line, the first too, starts after a newline
    try:
        samples = [(name, value) for name in GAUGE_KEYS for value in _samples(text, name)]
    except MalformedSampleError:
        return _UNKNOWN
    return reading_from(samples)


__all__ = [
    "GAUGE_KEYS",
    "EngineReading",
    "MalformedSampleError",
    "parse_engine_metrics",
    "reading_from",
    "sample_value",
]
