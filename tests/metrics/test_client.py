"""The client against scripted HTTP servers on 127.0.0.1: retries, backoff, error types, parsing.

Backoff is checked through an injected `sleep` that records the pauses it is asked for, so the
tests neither wait the pauses out nor assert wall-clock times; pytest-timeout catches a hang.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from fleetwarden.metrics.client import (
    MAX_POINTS_PER_QUERY,
    PrometheusClient,
    PrometheusError,
    PrometheusQueryError,
    PrometheusUnavailable,
    RetryPolicy,
    Sample,
    Series,
)
from tests.support.prometheus_server import free_port

Reply = tuple[int, str]  # status, body


def ok(result_type: str, result: Any) -> Reply:
    return 200, json.dumps(
        {"status": "success", "data": {"resultType": result_type, "result": result}}
    )


def error(status: int, kind: str, message: str) -> Reply:
    return status, json.dumps({"status": "error", "errorType": kind, "error": message})


class ScriptedServer:
    """Answers requests with the scripted replies in order (the last one repeats) and records
    each request's path and query string."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append(self.path)
                status, body = (
                    server.replies.pop(0) if len(server.replies) > 1 else server.replies[0]
                )
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        threading.Thread(
            target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def scripted() -> Iterator[list[ScriptedServer]]:
    servers: list[ScriptedServer] = []
    yield servers
    for server in servers:
        server.close()


class Pauses(list[float]):
    """A `sleep` that records instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


RETRY = RetryPolicy(attempts=4, first_backoff_s=0.5, multiplier=2.0, max_backoff_s=1.5)


def client_for(url: str, pauses: Pauses, **kwargs: Any) -> PrometheusClient:
    return PrometheusClient(
        url, connect_timeout_s=1.0, read_timeout_s=1.0, retry=RETRY, sleep=pauses, **kwargs
    )


def test_backoff_schedule_is_bounded() -> None:
    assert RETRY.pauses_s() == (0.5, 1.0, 1.5)
    assert RetryPolicy(attempts=1).pauses_s() == ()
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)


def test_error_tree() -> None:
    assert issubclass(PrometheusUnavailable, PrometheusError)
    assert issubclass(PrometheusQueryError, PrometheusError)
    assert not issubclass(PrometheusUnavailable, PrometheusQueryError)


@pytest.mark.timeout(30)
def test_nothing_listening_is_unavailable_after_bounded_attempts() -> None:
    pauses = Pauses()
    client = client_for(f"http://127.0.0.1:{free_port()}", pauses)
    with pytest.raises(PrometheusUnavailable, match="4 attempts"):
        client.instant("up")
    assert pauses == [0.5, 1.0, 1.5]
    assert client.worst_case_s == 4 * (1.0 + 1.0) + 3.0


@pytest.mark.timeout(30)
def test_a_silent_server_times_out_as_unavailable() -> None:
    """Accepts connections and never answers: each attempt ends at the read timeout."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        pauses = Pauses()
        client = PrometheusClient(
            f"http://127.0.0.1:{silent.getsockname()[1]}",
            connect_timeout_s=0.5,
            read_timeout_s=0.2,
            retry=RetryPolicy(attempts=2, first_backoff_s=0.25),
            sleep=pauses,
        )
        with pytest.raises(PrometheusUnavailable, match="2 attempts"):
            client.range_series("up", 0.0, 60.0, 15.0)
        assert pauses == [0.25]


def test_transient_503_is_retried_then_answers(scripted: list[ScriptedServer]) -> None:
    server = ScriptedServer(
        error(503, "unavailable", "starting"),
        (502, "bad gateway"),
        ok("vector", [{"metric": {"model": "m"}, "value": [100.5, "0.25"]}]),
    )
    scripted.append(server)
    pauses = Pauses()
    samples = client_for(server.url, pauses).instant("up", at_s=100.5)
    assert samples == [Sample({"model": "m"}, 100.5, 0.25)]
    assert pauses == [0.5, 1.0]
    assert len(server.requests) == 3
    assert "time=100.5" in server.requests[-1]
    assert "timeout=1.0" in server.requests[-1]  # server-side timeout matches the client's


def test_persistent_503_is_unavailable(scripted: list[ScriptedServer]) -> None:
    server = ScriptedServer(error(503, "timeout", "query timed out"))
    scripted.append(server)
    with pytest.raises(PrometheusUnavailable, match="query timed out"):
        client_for(server.url, Pauses()).instant("up")
    assert len(server.requests) == RETRY.attempts


@pytest.mark.parametrize(
    "reply",
    [
        error(400, "bad_data", "parse error"),
        error(422, "execution", "many-to-many matching"),
        (404, "not found"),
        (200, "this is not json"),
        (200, json.dumps({"status": "success"})),  # no data
        ok("vector", [{"metric": {}, "value": [1.0, "not a number"]}]),
    ],
    ids=["400", "422", "404", "not-json", "no-data", "bad-value"],
)
def test_rejected_or_unreadable_is_a_query_error_without_retry(
    scripted: list[ScriptedServer], reply: Reply
) -> None:
    server = ScriptedServer(reply)
    scripted.append(server)
    pauses = Pauses()
    with pytest.raises(PrometheusQueryError):
        client_for(server.url, pauses).instant("up")
    assert len(server.requests) == 1
    assert pauses == []


def test_error_message_carries_prometheus_reason(scripted: list[ScriptedServer]) -> None:
    server = ScriptedServer(error(400, "bad_data", 'parse error at char 4: unexpected "}"'))
    scripted.append(server)
    with pytest.raises(PrometheusQueryError, match=r"HTTP 400: bad_data: parse error"):
        client_for(server.url, Pauses()).instant("up}")


def test_scalar_result(scripted: list[ScriptedServer]) -> None:
    server = ScriptedServer(ok("scalar", [5.0, "42"]))
    scripted.append(server)
    assert client_for(server.url, Pauses()).instant("42") == [Sample({}, 5.0, 42.0)]


def test_range_vector_in_an_instant_query_is_refused(scripted: list[ScriptedServer]) -> None:
    server = ScriptedServer(ok("matrix", [{"metric": {}, "values": [[1.0, "1"]]}]))
    scripted.append(server)
    with pytest.raises(PrometheusQueryError, match="range_series"):
        client_for(server.url, Pauses()).instant("up[5m]")


def test_range_series_parses_special_values(scripted: list[ScriptedServer]) -> None:
    server = ScriptedServer(
        ok(
            "matrix",
            [{"metric": {"region": "eu"}, "values": [[60, "1.5"], [120, "NaN"], [180, "+Inf"]]}],
        )
    )
    scripted.append(server)
    (series,) = client_for(server.url, Pauses()).range_series("q", 60.0, 180.0, 60.0)
    assert series.labels == {"region": "eu"}
    assert series.timestamps_s == (60.0, 120.0, 180.0)
    assert series.values[0] == 1.5
    assert series.values[1] != series.values[1]
    assert series.values[2] == float("inf")
    assert "step=60.0" in server.requests[0]


def test_long_ranges_are_split_and_joined(scripted: list[ScriptedServer]) -> None:
    """15,001 points at a 1 s step: two queries on the same grid, one series back."""
    first = [[float(t), "1"] for t in range(0, MAX_POINTS_PER_QUERY)]
    second = [[float(t), "2"] for t in range(MAX_POINTS_PER_QUERY, 15_001)]
    server = ScriptedServer(
        ok("matrix", [{"metric": {"a": "1"}, "values": first}]),
        ok("matrix", [{"metric": {"a": "1"}, "values": second}]),
    )
    scripted.append(server)
    result = client_for(server.url, Pauses()).range_series("q", 0.0, 15_000.0, 1.0)
    assert len(server.requests) == 2
    assert "start=0&end=9999" in server.requests[0]
    assert "start=10000&end=15000" in server.requests[1]
    assert result == [
        Series(
            {"a": "1"},
            tuple(float(t) for t in range(15_001)),
            tuple([1.0] * MAX_POINTS_PER_QUERY + [2.0] * 5001),
        )
    ]


@pytest.mark.parametrize(
    ("start", "end", "step"),
    [(10.0, 0.0, 1.0), (0.0, 10.0, 0.0), (0.0, float("nan"), 1.0), (0.0, 10.0, -1.0)],
)
def test_range_arguments_are_checked(start: float, end: float, step: float) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message names the argument
        PrometheusClient("http://127.0.0.1:1").range_series("up", start, end, step)


def test_timeouts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeouts"):
        PrometheusClient("http://127.0.0.1:1", read_timeout_s=0.0)
