"""The batch service as a real subprocess (`python -m fleetwarden.batch`), for kill -9 tests."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class BatchProcess:
    """Starts, SIGKILLs and restarts one service process on a fixed port and config."""

    def __init__(self, config: dict[str, Any], directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.config_path = directory / "batch-config.json"
        self.config_path.write_text(json.dumps(config))
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.starts += 1
        with (self.directory / f"batch-{self.starts}.log").open("wb") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "fleetwarden.batch", "--config", str(self.config_path),
                 "--listen", f"127.0.0.1:{self.port}", "--log-level", "WARNING"],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    async def start(self) -> None:
        """Start and wait until /readyz answers 200 (startup recovery done)."""
        self.process = self._spawn()
        async with aiohttp.ClientSession() as session:
            for _ in range(600):
                if self.process.poll() is not None:
                    raise RuntimeError(f"batch process exited: {self.logs()}")
                try:
                    async with session.get(f"{self.base_url}/readyz") as response:
                        if response.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        raise RuntimeError(f"batch process never became ready: {self.logs()}")

    def kill9(self) -> None:
        """SIGKILL: no handler runs, nothing is flushed."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> int | None:
        """SIGTERM and wait; returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.directory.glob("batch-*.log"))
        )
