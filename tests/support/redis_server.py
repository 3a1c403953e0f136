"""A real Debian `redis-server` on 127.0.0.1 for tests and benchmarks.

Each server gets a free port and its own directory, runs with `appendonly yes` and
`appendfsync always` (the durability the batch store documents), and is killed at teardown.
Use `running_redis(dir)` as a context manager, or the `redis_server` pytest fixture.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


@dataclass(frozen=True)
class RedisServer:
    """A running server."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def running_redis(directory: Path, *, appendfsync: str = "always") -> Iterator[RedisServer]:
    """Start a server in `directory` and stop it (SIGKILL) on exit."""
    if not Path(REDIS_SERVER).exists():
        raise FileNotFoundError("redis-server is not installed (apt-get install redis-server)")
    directory.mkdir(parents=True, exist_ok=True)
    for _attempt in range(3):  # the free port can be taken between probing and binding
        port = _free_port()
        process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
             "--appendonly", "yes", "--appendfsync", appendfsync, "--save", "",
             "--protected-mode", "no", "--daemonize", "no", "--logfile", "redis.log"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and process.poll() is None:
            if _answers_ping(port):
                break
            time.sleep(0.02)
        if process.poll() is None and _answers_ping(port):
            break
        process.kill()
        process.wait()
    else:
        log = directory / "redis.log"
        raise RuntimeError(f"redis-server did not start: {log.read_text() if log.exists() else ''}")
    try:
        yield RedisServer(port, directory, process)
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server for one test; skipped where Debian's redis-server is absent."""
    if not Path(REDIS_SERVER).exists():
        pytest.skip("redis-server is not installed")
    with running_redis(tmp_path / "redis") as server:
        yield server
