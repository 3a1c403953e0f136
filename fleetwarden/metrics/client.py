"""A small synchronous Prometheus client: timeouts, bounded retries, typed errors, plain results.

It wraps `prometheus_api_client.PrometheusConnect` and adds what the operator needs to fail
static: every request has a connect and a read timeout, transient failures are retried a bounded
number of times with exponential backoff, and every failure surfaces as one of two errors, so a
caller can tell "no answer" (hold replicas, retry later) from "a bad query" (a bug):

    PrometheusError
    ├── PrometheusUnavailable   no usable answer after all attempts: refused or reset
    │                           connections, timeouts, HTTP 429 and 5xx
    └── PrometheusQueryError    Prometheus answered and rejected the query (HTTP 400, 422 and
                                other 4xx), or answered with something that is not its API

It is synchronous on purpose (the operator runs it in a worker thread; the planner CLI calls it
directly) and keeps no global state: all it holds is its own HTTP session. Worst-case time per call
is bounded by `worst_case_s` (attempts x timeouts + backoff), and `sleep` is injectable so tests
can check the backoff schedule without waiting it out.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, NamedTuple, TypeVar

import requests
from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

_LOG = logging.getLogger(__name__)

MAX_POINTS_PER_QUERY = 10_000
"""Points per series per range query; Prometheus refuses more than 11,000, so longer ranges (60
days at a 5-minute step is 17,280 points) are split into several queries and joined."""

_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_T = TypeVar("_T")


class PrometheusError(Exception):
    """Base of the client's errors."""


class PrometheusUnavailable(PrometheusError):  # noqa: N818 - the name the operator catches
    """No usable answer from Prometheus after every attempt; holding still is the safe reaction."""


class PrometheusQueryError(PrometheusError):
    """Prometheus rejected the query or answered with something unreadable; retrying won't help."""


class Series(NamedTuple):
    """One series of a range query: its labels and its samples, oldest first."""

    labels: dict[str, str]
    timestamps_s: tuple[float, ...]
    values: tuple[float, ...]


class Sample(NamedTuple):
    """One element of an instant query's result."""

    labels: dict[str, str]
    timestamp_s: float
    value: float


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently a failed request is repeated."""

    attempts: int = 3
    """Requests per call, first included. Three rides out a Prometheus restart or a dropped
    connection without holding a scaling tick (15 s) much longer than its timeouts."""
    first_backoff_s: float = 0.5
    """Pause after the first failure."""
    multiplier: float = 2.0
    """Each further pause is this many times the previous one."""
    max_backoff_s: float = 5.0
    """Longest single pause."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        for name in ("first_backoff_s", "multiplier", "max_backoff_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {value}")

    def pauses_s(self) -> tuple[float, ...]:
        """The pauses between attempts (one fewer than attempts)."""
        return tuple(
            min(self.max_backoff_s, self.first_backoff_s * self.multiplier**i)
            for i in range(self.attempts - 1)
        )


class _HttpStatusError(Exception):
    """A non-200 answer, raised from a session hook before PrometheusConnect flattens it into a
    message string; carries what classification needs."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


def _raise_for_status(response: requests.Response, *args: object, **kwargs: object) -> None:
    if response.status_code == 200:
        return
    try:
        body = response.json()
        detail = f"{body.get('errorType', '?')}: {body.get('error', '?')}"
    except (ValueError, AttributeError):
        detail = response.text[:200]
    raise _HttpStatusError(response.status_code, detail)


class PrometheusClient:
    """Range and instant queries against one Prometheus server.

    One instance may be shared by worker threads: its only mutable state is the requests session,
    whose connection pool is thread-safe for plain GETs like these.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 10.0,
        retry: RetryPolicy | None = None,
        headers: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`read_timeout_s` is also sent as the query's server-side `timeout`, so a slow query is
        cancelled in Prometheus instead of running on after the client gave up."""
        if connect_timeout_s <= 0 or read_timeout_s <= 0:
            raise ValueError("timeouts must be > 0")
        self.url = url.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        session = requests.Session()
        session.hooks["response"].append(_raise_for_status)
        # Retries are done here, not by urllib3 underneath, so they are counted and bounded once.
        self._prom: Any = PrometheusConnect(
            url=self.url,
            headers=dict(headers) if headers else None,
            retry=Retry(total=0, raise_on_status=False),
            session=session,
        )

    @property
    def worst_case_s(self) -> float:
        """Bound on one call's duration when Prometheus never answers (per query of a chunked
        range): every attempt times out and every pause is taken. The read timeout bounds each
        wait for bytes, so a server trickling an answer could take longer; Prometheus' own
        query timeout (sent with every query) is what stops a slow query."""
        per_attempt = self.connect_timeout_s + self.read_timeout_s
        return self.retry.attempts * per_attempt + sum(self.retry.pauses_s())

    def close(self) -> None:
        self._prom.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- queries ------------------------------------------------------------------------------

    def instant(self, query: str, at_s: float | None = None) -> list[Sample]:
        """Evaluate `query` at `at_s` (seconds since the epoch; None: the server's now)."""
        params = self._params()
        if at_s is not None:
            params["time"] = repr(float(at_s))
        result = self._call(
            lambda: self._prom.custom_query(query, params=params, timeout=self._timeout)
        )
        return _parsed(_samples, result)

    def range_series(self, query: str, start_s: float, end_s: float, step_s: float) -> list[Series]:
        """Evaluate `query` at `start_s, start_s + step_s, ...` up to `end_s` (seconds since the
        epoch, rounded to whole seconds by the underlying client).

        Ranges longer than MAX_POINTS_PER_QUERY steps are fetched in pieces and joined, so the
        caller sees one series per label set whatever the length.
        """
        if not (math.isfinite(start_s) and math.isfinite(end_s)) or end_s < start_s:
            raise ValueError(f"need finite start_s <= end_s, got {start_s}, {end_s}")
        if not math.isfinite(step_s) or step_s <= 0:
            raise ValueError(f"step_s must be > 0, got {step_s}")
        start, end = round(start_s), round(end_s)
        joined: dict[tuple[tuple[str, str], ...], Series] = {}
        for lo, hi in _chunks(start, end, step_s):
            for series in self._range_once(query, lo, hi, step_s):
                key = tuple(sorted(series.labels.items()))
                before = joined.get(key)
                if before is None:
                    joined[key] = series
                else:
                    joined[key] = Series(
                        before.labels,
                        before.timestamps_s + series.timestamps_s,
                        before.values + series.values,
                    )
        return list(joined.values())

    def _range_once(self, query: str, start: int, end: int, step_s: float) -> list[Series]:
        def call() -> Any:
            return self._prom.custom_query_range(
                query,
                start_time=datetime.fromtimestamp(start, tz=UTC),
                end_time=datetime.fromtimestamp(end, tz=UTC),
                step=repr(float(step_s)),
                params=self._params(),
                timeout=self._timeout,
            )

        return _parsed(_series, self._call(call))

    # --- plumbing -----------------------------------------------------------------------------

    @property
    def _timeout(self) -> tuple[float, float]:
        return (self.connect_timeout_s, self.read_timeout_s)

    def _params(self) -> dict[str, str]:
        # Bare float seconds: Prometheus durations with units must be whole ("0.5s" is refused).
        return {"timeout": repr(float(self.read_timeout_s))}

    def _call(self, request: Callable[[], Any]) -> Any:
        """Run `request` with the retry policy, translating every failure to the error tree."""
        pauses = self.retry.pauses_s()
        for attempt in range(self.retry.attempts):
            try:
                return request()
            except _HttpStatusError as exc:
                if exc.status not in _RETRY_STATUSES:
                    raise PrometheusQueryError(f"{self.url}: {exc}") from exc
                failure: Exception = exc
            except requests.JSONDecodeError as exc:
                raise PrometheusQueryError(f"{self.url}: answer is not JSON: {exc}") from exc
            except (KeyError, TypeError) as exc:
                raise PrometheusQueryError(f"{self.url}: unexpected answer: {exc!r}") from exc
            except requests.RequestException as exc:
                failure = exc
            if attempt < len(pauses):
                _LOG.warning(
                    "prometheus %s: attempt %d/%d failed (%s); retrying in %.2fs",
                    self.url,
                    attempt + 1,
                    self.retry.attempts,
                    failure,
                    pauses[attempt],
                )
                self._sleep(pauses[attempt])
        raise PrometheusUnavailable(
            f"{self.url}: no answer after {self.retry.attempts} attempts: {failure}"
        ) from failure


def _chunks(start: int, end: int, step_s: float) -> list[tuple[int, int]]:
    """Split [start, end] into ranges of at most MAX_POINTS_PER_QUERY points on the step grid.

    Only a whole-second step keeps the grid exact across pieces (the API rounds times to seconds),
    so a fractional step is never split.
    """
    points = int((end - start) // step_s) + 1
    if points <= MAX_POINTS_PER_QUERY or step_s != int(step_s):
        return [(start, end)]
    step = int(step_s)
    out = []
    for first in range(0, points, MAX_POINTS_PER_QUERY):
        last = min(points, first + MAX_POINTS_PER_QUERY) - 1
        out.append((start + first * step, start + last * step))
    return out


def _parsed(parse: Callable[[Any], _T], result: Any) -> _T:
    """`parse(result)`, with a malformed answer reported as PrometheusQueryError."""
    try:
        return parse(result)
    except (KeyError, TypeError, ValueError) as exc:
        raise PrometheusQueryError(f"unexpected answer from Prometheus: {exc!r}") from exc


def _labels(item: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in item.get("metric", {}).items()}


def _series(result: Any) -> list[Series]:
    out = []
    for item in result:
        points = item["values"]
        out.append(
            Series(
                _labels(item),
                tuple(float(ts) for ts, _ in points),
                tuple(float(v) for _, v in points),
            )
        )
    return out


def _samples(result: Any) -> list[Sample]:
    # A scalar or string result is a bare [timestamp, "value"] pair, not a list of series.
    if len(result) == 2 and isinstance(result[1], str):
        return [Sample({}, float(result[0]), float(result[1]))]
    out = []
    for item in result:
        if "value" not in item:
            raise PrometheusQueryError("instant query returned a range vector; use range_series")
        ts, value = item["value"]
        out.append(Sample(_labels(item), float(ts), float(value)))
    return out
