"""A real Prometheus for tests: Debian's `/usr/bin/prometheus` on 127.0.0.1, plus fake exporters.

What it gives:

- `PrometheusFactory.start(targets=..., history=...)` writes a temp config scraping the given
  exporters, backfills `history` (OpenMetrics text) into the new data dir with
  `promtool tsdb create-blocks-from openmetrics` BEFORE starting (blocks present at start are
  queryable at once; copied into a running server they appear only after about a minute), starts
  Prometheus on a free port and waits for `/-/ready` (well under a second);
- `PrometheusServer.wait_for_scrape()` polls the targets API until every target has been scraped
  once: the first scrape comes about 5 s after start (the discovery manager batches updates for
  5 s), so tests poll instead of sleeping a guessed time;
- `--storage.tsdb.retention.time` is 100 years, because retention counts back from the newest
  block, not from the wall clock: once live data compacts, backfilled history older than the
  retention would be deleted;
- `MetricsExporter` serves a `prometheus_client` registry's `generate_latest()` as
  `text/plain; version=0.0.4` from a thread on 127.0.0.1.

Why the exporter does not use `prometheus_client.start_http_server`: measured here with
prometheus_client 0.26 and Prometheus 2.42, its own server negotiates the OpenMetrics 1.0 format
from Prometheus' Accept header and escapes names to the legacy character set, so Prometheus
stores `vllm:kv_cache_usage_perc` as `vllm_kv_cache_usage_perc`. `generate_latest()` served as
text/plain keeps the colon (`vllm:kv_cache_usage_perc` is stored as is), like real vLLM. Tests
that need the underscore spelling register the gauge under that name.

Teardown kills every Prometheus a factory started (terminate, then kill), also when a test
failed; on Linux each process also gets SIGKILL if the test process dies without tearing down.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.server
import json
import math
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import pytest
from prometheus_client import CollectorRegistry, generate_latest

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"
RETENTION = "100y"


class PrometheusStartError(RuntimeError):
    """Prometheus or promtool failed; the message carries the tail of its log."""


def installed() -> bool:
    return Path(PROMETHEUS).exists() and Path(PROMTOOL).exists()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGKILL the child when the test process exits."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# --- OpenMetrics history ----------------------------------------------------------------------

Labels = Mapping[str, str]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Labels) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}" if inner else ""


def _number(value: float) -> str:
    """Whole numbers without a fraction, others to a millionth: exact enough for any test and
    half the text (promtool re-parses its whole input once per 2-hour block)."""
    if value == int(value):
        return str(int(value))
    return f"{value:.6f}"


def openmetrics_family(
    name: str,
    kind: str,
    series: Iterable[tuple[Labels, Iterable[tuple[float, float]]]],
) -> str:
    """One metric family in OpenMetrics text: `# TYPE` line, then each series' samples in time
    order. For `kind="counter"`, `name` is the family name and samples get the `_total` suffix
    (OpenMetrics requires both, and promtool refuses counters without them)."""
    sample_name = f"{name}_total" if kind == "counter" else name
    lines = [f"# TYPE {name} {kind}"]
    for labels, samples in series:
        rendered = _labels(labels)
        lines.extend(f"{sample_name}{rendered} {_number(v)} {_number(t)}" for t, v in samples)
    return "\n".join(lines) + "\n"


def openmetrics_document(*families: str) -> str:
    """Families joined and terminated with the mandatory `# EOF`."""
    return "".join(families) + "# EOF\n"


def create_blocks(openmetrics: str, data_dir: Path) -> None:
    """Backfill `openmetrics` into `data_dir` as TSDB blocks (run before Prometheus starts)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    source = data_dir.parent / f"{data_dir.name}-history.om"
    source.write_text(openmetrics)
    done = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "-q", str(source), str(data_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    source.unlink()
    if done.returncode:
        raise PrometheusStartError(f"promtool failed: {done.stderr[-2000:]}")


# --- exporters --------------------------------------------------------------------------------


class MetricsExporter:
    """Serves one registry at http://127.0.0.1:<port>/metrics as Prometheus text format."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = generate_latest(exporter.registry)
                self.send_response(200)
                self.send_header("Content-Type", TEXT_FORMAT)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> str:
        """`host:port`, as a scrape target."""
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsExporter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# --- the server -------------------------------------------------------------------------------


class PrometheusServer:
    """One running Prometheus process with its own config, data dir and log file."""

    def __init__(self, root: Path, port: int, process: subprocess.Popen[bytes], log: Path) -> None:
        self.root, self.port, self.process, self.log = root, port, process, log
        self.url = f"http://127.0.0.1:{port}"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _get(self, path: str, timeout_s: float = 1.0) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=timeout_s) as response:
            body: bytes = response.read()
            return body

    def _poll(self, what: str, check: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise PrometheusStartError(
                    f"prometheus exited ({self.process.returncode}) waiting for {what}:\n"
                    + self.log_tail()
                )
            with contextlib.suppress(OSError, ValueError):
                if check():
                    return
            if time.monotonic() > deadline:
                raise PrometheusStartError(f"timed out waiting for {what}:\n{self.log_tail()}")
            time.sleep(0.05)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Poll `/-/ready` until Prometheus answers 200."""
        self._poll("/-/ready", lambda: bool(self._get("/-/ready")), timeout_s)

    def targets(self) -> list[dict[str, object]]:
        data = json.loads(self._get("/api/v1/targets?state=active"))
        active: list[dict[str, object]] = data["data"]["activeTargets"]
        return active

    def wait_for_scrape(self, timeout_s: float = 30.0) -> None:
        """Poll the targets API until every target has been scraped successfully once."""

        def scraped() -> bool:
            targets = self.targets()
            return bool(targets) and all(t.get("health") == "up" for t in targets)

        self._poll("the first scrape of every target", scraped, timeout_s)

    def stop(self) -> None:
        """Terminate, then kill if it does not exit in 10 s. Idempotent."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


class PrometheusFactory:
    """Starts Prometheus servers under `base_dir` and stops all of them on close."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self._servers: list[PrometheusServer] = []

    def start(
        self,
        *,
        targets: Mapping[str, Sequence[str]] | None = None,
        history: str | None = None,
        scrape_interval_s: float = 1.0,
        wait_for_scrape: bool = True,
    ) -> PrometheusServer:
        """A ready Prometheus scraping `targets` (job name -> `host:port` list), with `history`
        (an OpenMetrics document) backfilled before start. With targets and `wait_for_scrape`,
        returns only once every target has been scraped."""
        root = self.base_dir / f"prometheus-{len(self._servers)}"
        data = root / "data"
        data.mkdir(parents=True)
        if history is not None:
            create_blocks(history, data)
        interval = f"{math.ceil(scrape_interval_s * 1000)}ms"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(addresses)}]}
                for job, addresses in (targets or {}).items()
            ],
        }
        (root / "prometheus.yml").write_text(json.dumps(config, indent=2))  # JSON is YAML
        port = free_port()
        log = root / "prometheus.log"
        with log.open("wb") as log_file:
            process = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={root / 'prometheus.yml'}",
                    f"--storage.tsdb.path={data}",
                    f"--storage.tsdb.retention.time={RETENTION}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        server = PrometheusServer(root, port, process, log)
        self._servers.append(server)
        server.wait_ready()
        if targets and wait_for_scrape:
            server.wait_for_scrape()
        return server

    def close(self) -> None:
        for server in self._servers:
            server.stop()

    def __enter__(self) -> PrometheusFactory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@pytest.fixture(scope="session")
def prometheus_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusFactory]:
    """Session-wide factory of real Prometheus servers; skips where Prometheus is not installed."""
    if not installed():
        pytest.skip("needs Debian's prometheus and promtool (apt-get install prometheus)")
    with PrometheusFactory(tmp_path_factory.mktemp("prometheus")) as factory:
        yield factory
