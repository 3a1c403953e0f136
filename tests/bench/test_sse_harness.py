"""The native benchmark harness `bench/native/sse_harness.c`: its stub engine and its load generator.

The harness is built once per session with the system C compiler and skipped where there is none
(a compiler's warnings do not fail the build: another compiler version may add some). The engine is driven by `http.client` and raw sockets; the load
generator runs against the engine, against a tiny Python server that splits its bytes in awkward
places, and against the real sidecar (`fleetwarden sidecar`) in front of the engine.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetwarden.sidecar.engine_metrics import parse_engine_metrics
from tests.support.engine_metrics_oracle import reference_reading
from tests.support.prometheus_server import free_port

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "bench" / "native" / "sse_harness.c"
CHAT = "/v1/chat/completions"
GAUGES = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"}
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}

Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture(scope="session")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (`cc`) on PATH to build bench/native/sse_harness.c")
    binary = tmp_path_factory.mktemp("native") / "sse_harness"
    command = [cc, "-O2", "-Wall", "-Wextra", "-std=gnu11", "-o", str(binary)]
    built = subprocess.run(
        [*command, str(SOURCE), "-lm"], capture_output=True, text=True, check=False
    )
    assert built.returncode == 0, built.stderr
    return binary


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Start child processes (stderr to a log file); teardown ends every one of them."""
    children: list[subprocess.Popen[bytes]] = []

    def start(*command: object) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"child-{len(children)}.log").open("wb")
        child = subprocess.Popen(
            [str(part) for part in command],
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=ROOT,
            env=ENV,
        )
        log.close()
        children.append(child)
        return child

    yield start
    for child in children:
        child.terminate()
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=5)
        assert child.stdout is not None
        child.stdout.close()


@pytest.fixture
def engine(harness: Path, spawn: Spawn) -> Callable[..., int]:
    """Start the harness engine with the given pace; returns its port once it says ready."""

    def start(pace_us: int, *flags: str) -> int:
        port = free_port()
        child = spawn(harness, "engine", "--port", port, "--pace-us", pace_us, *flags)
        assert child.stdout is not None
        assert child.stdout.readline() == f"ready {port}\n".encode()
        return port

    return start


def run_load(harness: Path, port: int, *options: object) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}{CHAT}"
    command = [harness, "load", "--url", url, *options]
    done = subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def chat_body(tokens: int, *, stream: bool = True, usage: bool = False) -> str:
    body: dict[str, Any] = {"model": "stub-model", "max_tokens": tokens, "stream": stream}
    if usage:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body)  # json.dumps writes `"stream": true`: a space after the colon


def sse_payloads(body: bytes) -> list[str]:
    events = [event for event in body.decode().split("\n\n") if event]
    assert all(event.startswith("data: ") for event in events), events
    return [event.removeprefix("data: ") for event in events]


def test_engine_health_metrics_models_and_404(engine: Callable[..., int]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", engine(20_000), timeout=5)
    conn.request("GET", "/health")
    response = conn.getresponse()
    assert (response.status, response.read()) == (200, b"ok")
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    assert response.status == 200
    assert set(families) >= GAUGES
    assert all(families[name].type == "gauge" for name in GAUGES)
    conn.request("GET", "/v1/models")
    response = conn.getresponse()
    assert json.loads(response.read())["data"] == [{"id": "stub-model", "object": "model"}]
    conn.request("GET", "/nowhere")
    response = conn.getresponse()
    assert response.status == 404
    assert json.loads(response.read())["error"]["type"] == "NotFoundError"


def test_engine_metrics_padded_like_vllm(engine: Callable[..., int]) -> None:
    """`--metrics-pad` puts vLLM-sized histograms before the gauges: a valid exposition that the
    sidecar's scanner reads exactly as a full parse does (the bench then pays a real scrape)."""
    conn = http.client.HTTPConnection(
        "127.0.0.1", engine(20_000, "--metrics-pad", "600"), timeout=5
    )
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    text = response.read().decode()
    assert response.status == 200
    assert text.count("\n") >= 600
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) >= GAUGES
    assert sum(f.type == "histogram" for f in families.values()) >= 25
    reading = parse_engine_metrics(text)
    assert reading == reference_reading(text)
    assert (reading.waiting, reading.running, reading.kv_utilization) == (0, 0, 0.1)


def test_engine_streams_paced_tokens_in_order_then_serves_the_next_request(
    engine: Callable[..., int],
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", engine(20_000), timeout=5)
    started = time.perf_counter()
    conn.request("POST", CHAT, body=chat_body(5, usage=True))
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/event-stream"
    payloads = sse_payloads(response.read())
    elapsed = time.perf_counter() - started
    assert elapsed >= 0.09  # five tokens 20 ms apart: the engine never sends one early
    assert payloads[-1] == "[DONE]"
    events = [json.loads(payload) for payload in payloads[:-1]]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = [event["choices"][0] for event in events[1:-1]]
    assert [choice["delta"]["content"] for choice in tokens] == [f"t{i} " for i in range(5)]
    assert [choice["finish_reason"] for choice in tokens] == [None] * 4 + ["length"]
    usage = events[-1]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 5
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 5
    assert len({event["id"] for event in events}) == 1

    conn.request("POST", CHAT, body=chat_body(3, stream=False))  # same keep-alive connection
    response = conn.getresponse()
    completion = json.loads(response.read())
    assert completion["choices"][0]["message"]["content"] == "t0 t1 t2 "
    assert completion["usage"]["completion_tokens"] == 3


def read_until(sock: socket.socket, marker: bytes, count: int) -> bytes:
    data = b""
    while data.count(marker) < count:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    return data


def test_engine_frames_one_event_per_chunk_for_split_and_pipelined_requests(
    engine: Callable[..., int],
) -> None:
    body = chat_body(2).encode()
    request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    with socket.create_connection(("127.0.0.1", engine(0))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(request[:30])  # the first request arrives in two pieces...
        time.sleep(0.05)
        sock.sendall(request[30:] + request)  # ...the second is pipelined behind it
        raw = read_until(sock, b"\r\n0\r\n\r\n", 2)
    responses = raw.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert len(responses) == 2
    for response in responses:
        _, body_bytes = response.split(b"\r\n\r\n", 1)
        chunks = []
        while True:
            size_line, rest = body_bytes.split(b"\r\n", 1)
            size = int(size_line, 16)
            if size == 0:
                break
            chunks.append(rest[:size])
            assert rest[size : size + 2] == b"\r\n"
            body_bytes = rest[size + 2 :]
        assert all(chunk.startswith(b"data: ") and chunk.count(b"\n\n") == 1 for chunk in chunks)
        assert len(chunks) == 4  # role, two tokens, [DONE]


def test_load_against_the_engine(harness: Path, engine: Callable[..., int]) -> None:
    port = engine(2000)
    report = run_load(harness, port, "--concurrency", 8, "--tokens", 16, "--duration-s", 1,
                      "--warmup-s", 0.3)  # fmt: skip
    assert report["errors"] == {}
    assert report["requests_done"] > 0
    assert report["tokens_in_window"] > 0
    assert report["ttft_us"]["p50"] >= 1500  # the first token is due a pace after the request
    assert report["gap_us"]["n"] > 0
    assert report["ttfb_us"]["n"] == report["ttft_us"]["n"] > 0
    assert set(report["cpu_s"]) == {"user", "system"}


def test_load_rejects_bad_arguments(harness: Path) -> None:
    for args in (["--url", "https://127.0.0.1:1/x"], ["--url", "http://localhost:80/"], ["--x"]):
        done = subprocess.run([str(harness), "load", *args], capture_output=True, check=False)
        assert done.returncode == 2, args


def serve_split_streams(listener: socket.socket, tokens: int) -> None:
    """Answer the first request 429, then stream: markers cut across chunks and across sends."""
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    mark = b'"content":"t'
    pending, served = b"", 0
    with conn:
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            pending += data
            head, sep, rest = pending.partition(b"\r\n\r\n")
            if not sep:
                continue
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(rest) < length:
                continue
            pending = rest[length:]
            if served == 0:
                error = b'{"error":{"message":"slow down"}}'
                reply = b"HTTP/1.1 429 Too Many\r\nContent-Length: %d\r\n\r\n%s" % (
                    len(error),
                    error,
                )
            else:
                chunks = [b'data: {"delta":{"role":"assistant","content":""}}\n\n']
                for i in range(tokens):
                    event = b'data: {"delta":{"content":"t%d "}}\n\n' % i
                    cut = event.index(mark) + 1 + i % 10  # inside the marker
                    chunks += [event[:cut], event[cut:]]
                chunks.append(b"data: [DONE]\n\n")
                framed = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
                reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + framed
                reply += b"0\r\n\r\n"
            served += 1
            for start in range(0, len(reply), 7):  # 7-byte sends also split chunk sizes
                conn.sendall(reply[start : start + 7])
                if start % 28 == 0:
                    time.sleep(0.0002)


def test_load_parses_streams_split_anywhere(harness: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        server = threading.Thread(target=serve_split_streams, args=(listener, 6), daemon=True)
        server.start()
        port = listener.getsockname()[1]
        report = run_load(harness, port, "--concurrency", 1, "--tokens", 6, "--duration-s", 0.5,
                          "--warmup-s", 0, "--drain-s", 5)  # fmt: skip
        server.join(timeout=5)
    assert report["errors"] == {"http_429": 1}
    assert report["requests_done"] > 0
    assert report["tokens_in_window"] >= 6 * report["requests_done"]


def write_sidecar_config(path: Path) -> None:
    from fleetwarden.api.enums import PolicyName
    from fleetwarden.fairness.config import GateConfig
    from fleetwarden.fairness.render import standalone_config

    base = standalone_config("stub-model")
    gate = GateConfig(
        max_inflight_tokens=None,
        max_waiting_requests=1_000_000,
        telemetry_max_age_s=base.gate.telemetry_max_age_s,
    )
    path.write_text(base.model_copy(update={"policy": PolicyName.VTC, "gate": gate}).to_document())


def wait_ready(url: str, child: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert child.poll() is None, "the sidecar exited before it was ready"
        with contextlib.suppress(urllib.error.URLError, OSError):
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        time.sleep(0.1)
    pytest.fail(f"{url} was not ready within {timeout_s} s")


def test_load_through_the_real_sidecar(
    harness: Path, engine: Callable[..., int], spawn: Spawn, tmp_path: Path
) -> None:
    engine_port, sidecar_port = engine(2000), free_port()
    config = tmp_path / "fairness.json"
    write_sidecar_config(config)
    sidecar = spawn(sys.executable, "-m", "fleetwarden.cli", "sidecar",
                    "--engine-url", f"http://127.0.0.1:{engine_port}",
                    "--listen", f"127.0.0.1:{sidecar_port}", "--config", config)  # fmt: skip
    wait_ready(f"http://127.0.0.1:{sidecar_port}/readyz", sidecar)
    report = run_load(harness, sidecar_port, "--concurrency", 16, "--tokens", 16,
                      "--duration-s", 1, "--warmup-s", 0.3)  # fmt: skip
    assert report["errors"] == {}  # so no wrong_token_count: every request had all 16 tokens
    assert report["requests_done"] > 0
    assert report["tokens_in_window"] > 0


def test_pipe_relays_streams_byte_for_byte(
    harness: Path, engine: Callable[..., int], spawn: Spawn
) -> None:
    """The pipe (the bench's floor for any relay) passes the engine's bytes through unchanged,
    keeps a client's keep-alive connection on one upstream connection, and carries load."""
    upstream = engine(1000)
    port = free_port()
    pipe = spawn(harness, "pipe", "--port", port, "--upstream-port", upstream)
    assert pipe.stdout is not None
    assert pipe.stdout.readline() == f"ready {port}\n".encode()
    bodies = {}
    for target in (upstream, port):
        conn = http.client.HTTPConnection("127.0.0.1", target, timeout=10)
        for _ in range(2):  # the second request reuses the connection
            conn.request("POST", CHAT, body=chat_body(5, usage=True))
            response = conn.getresponse()
            assert response.status == 200
            bodies.setdefault(target, []).append(sse_payloads(response.read()))
        conn.close()
    ids = {json.loads(p)["id"] for p in bodies[port][0] + bodies[port][1] if p != "[DONE]"}
    assert len(ids) == 2  # two completions on one connection, each with its own id
    strip = [[p.split('"model"')[1] for p in stream if p != "[DONE]"] for stream in bodies[port]]
    direct = [
        [p.split('"model"')[1] for p in stream if p != "[DONE]"] for stream in bodies[upstream]
    ]
    assert strip == direct  # same events, after the per-response id and time
    report = run_load(harness, port, "--concurrency", 16, "--tokens", 8, "--duration-s", 1,
                      "--warmup-s", 0.3)  # fmt: skip
    assert report["errors"] == {}
    assert report["requests_done"] > 0
    assert pipe.poll() is None


def test_pipe_rejects_bad_arguments(harness: Path) -> None:
    cases = {
        (): b"pipe: --port and --upstream-port are required",
        ("--port", "1"): b"pipe: --port and --upstream-port are required",
        ("--port", "0", "--upstream-port", "1"): b"bad value for --port: 0",
        ("--x",): b"pipe: bad argument --x",
    }
    for args, message in cases.items():
        done = subprocess.run([str(harness), "pipe", *args], capture_output=True, check=False)
        assert (done.returncode, message in done.stderr) == (2, True), (args, done.stderr)
