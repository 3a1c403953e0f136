"""Benchmark: the sidecar's overhead on one core, with engine and load generator in C; prints JSON.

Why a second sidecar bench: in `bench/sidecar_overhead.py` the stub engine and the load generator
are Python (aiohttp) and share one core, so at the maximum pace they, not the sidecar, limit the
run (the sidecar sat at ~43% of its core), and their own scheduling noise (the direct path's TTFB
p99 was ~40 ms) drowns a sub-millisecond difference. Here both are `bench/native/sse_harness.c`
(compiled with `cc` on first use into `build/native/`): an epoll engine that streams OpenAI chat
chunks at a fixed pace per stream, and an epoll load generator with C keep-alive clients. They use
a small share of the second core, so the sidecar, pinned alone to its core, is what is measured.

Two parts, each run through the real `fleetwarden sidecar` (VTC, a gate that never holds back):

- latency: C streams (default 256), N tokens each at a fixed pace (default 64 at 20 ms), clients
  re-sending at once; direct and through the sidecar in alternating phases; added TTFT/TTFB p50
  and p99 (sidecar minus direct), added inter-token p99, sidecar CPU per 1k tokens, peak RSS.
  By default each stream has its own pace phase (staggered), as a server that is not lockstep
  would emit; `--lockstep` emits every stream's token at one global tick, as vLLM's decode step
  does, so 256 events reach the sidecar at once and a new request's first token waits behind
  the burst: that shows the cost of per-event relaying in one Python process.
- one-core throughput: many streams at a fast pace (default 512 at 5 ms, 256 tokens each: about
  100,000 tokens/s offered, checked on the direct path), so the sidecar saturates its core;
  relayed tokens/s is then its one-core ceiling.

The engine's `/metrics` carries about 600 histogram lines before its gauges
(`--engine-metrics-lines`), as vLLM's does: the sidecar scrapes it four times a second on the same
event loop, so a scrape must cost in the bench what it costs in production (a full parse of
vLLM's exposition once cost 12.5 ms per scrape, unseen while the stub served six lines).

Targets (issue 3): added TTFT p99 under 1 ms at 256 concurrent streams; at least 50,000 relayed
tokens/s on one core.

Usage: python bench/sidecar_native.py [--concurrency 256] [--tokens 64] [--pace-ms 20]
       [--duration-s 20] [--rounds 2] [--lockstep] [--engine-metrics-lines 600]
       [--max-concurrency 512] [--max-pace-ms 5]
       [--max-tokens 256] [--max-duration-s 15] [--relay sidecar|sidecar-python|pipe]
       [--quick] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sidecar_overhead import (  # noqa: E402
    Child,
    added,
    added_latency_verdict,
    core_busy,
    core_times,
    fairness_config,
    free_port,
    machine,
    proc_cpu_seconds,
    proc_run_delay_s,
    stop_all,
    wait_http_ok,
)
from fleetwarden.sidecar.native_relay import NATIVE_MISSING  # noqa: E402

SOURCE = ROOT / "bench" / "native" / "sse_harness.c"
BINARY = ROOT / "build" / "native" / "sse_harness"
TARGET_ADDED_TTFT_MS = 1.0
TARGET_TOKENS_PER_S = 50_000
SATURATED = 0.85


def progress(message: str) -> None:
    print(f"[sidecar_native] {message}", file=sys.stderr, flush=True)


def build_harness() -> Path:
    """Compile the C harness when missing or older than its source."""
    if BINARY.exists() and BINARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return BINARY
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit(
            "sidecar_native: no C compiler (cc/gcc) to build bench/native/sse_harness.c"
        )
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    command = [compiler, "-O2", "-Wall", "-std=gnu11", "-o", str(BINARY), str(SOURCE), "-lm"]
    subprocess.run(command, check=True)
    return BINARY


class Stack:
    """One C engine and one sidecar in front of it; the sidecar alone on `sidecar_cpus`."""

    def __init__(
        self,
        name: str,
        pace_ms: float,
        lockstep: bool,
        cpus: tuple[set[int] | None, set[int] | None],
        workdir: Path,
        children: list[Child],
        metrics_lines: int = 0,
        relay: str = "sidecar",
    ) -> None:
        sidecar_cpus, load_cpus = cpus
        self.load_cpus = load_cpus
        engine_port, sidecar_port = free_port(), free_port()
        engine_argv = [str(BINARY), "engine", "--port", str(engine_port)]
        engine_argv += ["--pace-us", str(round(pace_ms * 1000))]
        engine_argv += ["--lockstep"] if lockstep else []
        engine_argv += ["--metrics-pad", str(metrics_lines)]
        self.engine = Child(f"{name}-engine", engine_argv, load_cpus, workdir, 0)
        children.append(self.engine)
        config = workdir / "fairness.json"
        config.write_text(fairness_config().to_document())
        relay_argv = (
            [str(BINARY), "pipe", "--port", str(sidecar_port), "--upstream-port", str(engine_port)]
            if relay == "pipe"
            else [sys.executable, "-m", "fleetwarden.cli", "sidecar",
                  "--engine-url", f"http://127.0.0.1:{engine_port}",
                  "--listen", f"127.0.0.1:{sidecar_port}", "--config", str(config),
                  "--relay", "python" if relay == "sidecar-python" else "auto"]
        )  # fmt: skip
        self.sidecar = Child(f"{name}-{relay}", relay_argv, sidecar_cpus, workdir, 0)
        children.append(self.sidecar)
        self.urls = {
            "direct": f"http://127.0.0.1:{engine_port}/v1/chat/completions",
            "sidecar": f"http://127.0.0.1:{sidecar_port}/v1/chat/completions",
        }
        asyncio.run(wait_http_ok(f"http://127.0.0.1:{engine_port}/health", self.engine))
        ready = "/health" if relay == "pipe" else "/readyz"  # the pipe reaches the engine's
        asyncio.run(wait_http_ok(f"http://127.0.0.1:{sidecar_port}{ready}", self.sidecar))
        progress(f"{name} stack ready (engine pid {self.engine.pid}, sidecar {self.sidecar.pid})")

    def run_phase(
        self,
        path: str,
        *,
        concurrency: int,
        tokens: int,
        warmup_s: float,
        duration_s: float,
        seed: int,
    ) -> dict[str, Any]:
        """One load-generator run against one path; CPU of every process over its window."""
        argv = [str(BINARY), "load", "--url", self.urls[path], "--concurrency", str(concurrency),
                "--tokens", str(tokens), "--warmup-s", str(warmup_s),
                "--duration-s", str(duration_s), "--seed", str(seed)]  # fmt: skip
        started = time.monotonic()
        load = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if self.load_cpus is not None:
            os.sched_setaffinity(load.pid, self.load_cpus)
        pids = {"sidecar": self.sidecar.pid, "engine": self.engine.pid, "load": load.pid}
        time.sleep(max(0.0, started + warmup_s - time.monotonic()))
        cpu0 = {who: self._cpu(pid) for who, pid in pids.items()}
        wait0 = {who: proc_run_delay_s(pid) for who, pid in pids.items()}
        cores0, wall0 = core_times(), time.monotonic()
        time.sleep(max(0.0, started + warmup_s + duration_s - time.monotonic()))
        cpu1 = {who: self._cpu(pid) for who, pid in pids.items()}
        wait1 = {who: proc_run_delay_s(pid) for who, pid in pids.items()}
        wall, busy = time.monotonic() - wall0, core_busy(cores0, core_times())
        out, err = load.communicate(timeout=120)
        if load.returncode != 0:
            raise RuntimeError(f"load generator exited {load.returncode}: {err[-2000:]}")
        self.engine.check_alive()
        self.sidecar.check_alive()
        result: dict[str, Any] = json.loads(out)
        cpu = {who: sum(cpu1[who]) - sum(cpu0[who]) for who in pids}
        result["window"] = {
            "wall_s": round(wall, 3),
            "cpu_s": {who: round(seconds, 3) for who, seconds in cpu.items()},
            "kernel_s": {who: round(cpu1[who][1] - cpu0[who][1], 3) for who in pids},
            "demand": {who: round((cpu[who] + wait1[who] - wait0[who]) / wall, 3) for who in pids},
            "core_busy": busy,
        }
        return result

    @staticmethod
    def _cpu(pid: int) -> tuple[float, float]:
        try:
            return proc_cpu_seconds(pid)
        except OSError:
            return (0.0, 0.0)  # the load process already exited

    def stop(self) -> float:
        """Stop both; the sidecar's peak RSS in MiB."""
        rss = self.sidecar.peak_rss_mib()
        stop_all([self.sidecar, self.engine])
        return rss


def merged(phases: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Milliseconds: each percentile is the mean of the phases' percentiles (each phase weighs the
    same); the mean is over all samples."""
    stats = [p[key] for p in phases if p[key].get("n")]
    if not stats:
        return {"n": 0}
    out = {q: round(sum(s[q] for s in stats) / len(stats) / 1000, 3) for q in ("p50", "p90", "p99")}
    out["n"] = sum(s["n"] for s in stats)
    out["mean"] = round(sum(s["mean"] * s["n"] for s in stats) / out["n"] / 1000, 3)
    out["max"] = round(max(s["max"] for s in stats) / 1000, 3)
    return out


def path_summary(phases: list[dict[str, Any]]) -> dict[str, Any]:
    wall = sum(p["window"]["wall_s"] for p in phases)
    tokens = sum(p["tokens_in_window"] for p in phases)
    sidecar_cpu = sum(p["window"]["cpu_s"]["sidecar"] for p in phases)
    errors: dict[str, int] = {}
    for phase in phases:
        for kind, n in phase["errors"].items():
            errors[kind] = errors.get(kind, 0) + n
    demand = {
        who: round(sum(p["window"]["demand"][who] for p in phases) / len(phases), 3)
        for who in ("sidecar", "engine", "load")
    }
    return {
        "ttft_ms": merged(phases, "ttft_us"),
        "ttfb_ms": merged(phases, "ttfb_us"),
        "inter_token_ms": merged(phases, "gap_us"),
        "tokens_per_s": round(tokens / wall) if wall else 0,
        "requests_completed": sum(p["requests_done"] for p in phases),
        "errors": errors,
        "cpu_demand": demand,
        "cpu_bound": [who for who, d in demand.items() if d >= SATURATED],
        "sidecar_cpu_s_per_1k_tokens": round(sidecar_cpu / (tokens / 1000), 4) if tokens else None,
        "tokens_per_sidecar_cpu_s": round(tokens / sidecar_cpu) if sidecar_cpu > 0.01 else None,
        "windows": [p["window"] for p in phases],
    }


def layout() -> tuple[set[int] | None, set[int] | None]:
    """The sidecar alone on the last core; engine, load and this driver on the others."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    sidecar, rest = {cpus[-1]}, set(cpus[:-1])
    os.sched_setaffinity(0, rest)
    return sidecar, rest


def bench(args: argparse.Namespace, children: list[Child], workdir: Path) -> dict[str, Any]:
    build_harness()
    cpus = layout()
    info = machine(*cpus)
    info["engine_and_load"] = "bench/native/sse_harness.c (C, epoll)"
    del info["stub_and_generator_cpus"]
    info["engine_and_load_cpus"] = sorted(cpus[1]) if cpus[1] else "unpinned"

    latency = Stack(
        "latency", args.pace_ms, args.lockstep, cpus, workdir, children,
        args.engine_metrics_lines, args.relay,
    )  # fmt: skip
    phases: dict[str, list[dict[str, Any]]] = {"direct": [], "sidecar": []}
    for index in range(args.rounds):
        for path in ("direct", "sidecar") if index % 2 == 0 else ("sidecar", "direct"):
            phase = latency.run_phase(
                path,
                concurrency=args.concurrency,
                tokens=args.tokens,
                warmup_s=args.warmup_s,
                duration_s=args.duration_s,
                seed=index,
            )
            phases[path].append(phase)
            progress(f"latency round {index + 1} {path}: {phase['requests_done']} requests")
    latency_rss = latency.stop()
    direct, via = path_summary(phases["direct"]), path_summary(phases["sidecar"])

    fast = Stack(
        "throughput", args.max_pace_ms, False, cpus, workdir, children,
        args.engine_metrics_lines, args.relay,
    )  # fmt: skip
    fast_phases: dict[str, dict[str, Any]] = {}
    for path in ("direct", "sidecar"):
        fast_phases[path] = fast.run_phase(
            path,
            concurrency=args.max_concurrency,
            tokens=args.max_tokens,
            warmup_s=min(2.0, args.warmup_s),
            duration_s=args.max_duration_s,
            seed=99,
        )
        progress(f"throughput {path}: {fast_phases[path]['tokens_per_s']:.0f} tokens/s")
    fast_rss = fast.stop()
    fast_direct = path_summary([fast_phases["direct"]])
    fast_via = path_summary([fast_phases["sidecar"]])

    added_ttft = added(via, direct, "ttft_ms")
    added_ttfb = added(via, direct, "ttfb_ms")
    saturated = "sidecar" in fast_via["cpu_bound"]
    return {
        "benchmark": "sidecar_native",
        "parameters": {
            "concurrency": args.concurrency,
            "tokens_per_request": args.tokens,
            "pace_ms": args.pace_ms,
            "emission": "lockstep" if args.lockstep else "staggered",
            "engine_metrics_lines": args.engine_metrics_lines,
            "duration_s_per_phase": args.duration_s,
            "warmup_s": args.warmup_s,
            "rounds": args.rounds,
            "policy": "vtc" if args.relay != "pipe" else None,
            "relay": args.relay,
            "native_relay_built": NATIVE_MISSING is None,
            "max_throughput": {
                "concurrency": args.max_concurrency,
                "tokens_per_request": args.max_tokens,
                "pace_ms": args.max_pace_ms,
                "duration_s": args.max_duration_s,
            },
            "quick": args.quick,
        },
        "latency": {
            "direct": direct,
            "sidecar": via,
            "added_ttft_ms": added_ttft,
            "added_ttfb_ms": added_ttfb,
            "added_inter_token_ms": added(via, direct, "inter_token_ms"),
            "sidecar_peak_rss_mib": latency_rss,
        },
        "max_throughput": {
            "direct": fast_direct,
            "sidecar": fast_via,
            "sidecar_peak_rss_mib": fast_rss,
        },
        "targets": {
            "added_ttft_p99_under_1ms": {
                **added_latency_verdict(direct, added_ttft, added_ttfb, TARGET_ADDED_TTFT_MS),
                "processes_cpu_bound": sorted(set(direct["cpu_bound"]) | set(via["cpu_bound"])),
            },
            "relayed_tokens_per_s_one_core_at_least_50000": {
                "measured": fast_via["tokens_per_s"],
                "direct_offered": fast_direct["tokens_per_s"],
                "sidecar_saturated": saturated,
                "met": fast_via["tokens_per_s"] >= TARGET_TOKENS_PER_S,
            },
        },
        "machine": {**info, "load_average_at_end": [round(x, 2) for x in os.getloadavg()]},
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--pace-ms", type=float, default=20.0)
    parser.add_argument("--lockstep", action="store_true", help="one global decode tick")
    parser.add_argument(
        "--engine-metrics-lines",
        type=int,
        default=600,
        help="histogram lines before the engine's gauges on /metrics (vLLM's: about 600)",
    )
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-concurrency", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-pace-ms", type=float, default=5.0)
    parser.add_argument("--max-duration-s", type=float, default=15.0)
    parser.add_argument(
        "--relay",
        choices=("sidecar", "sidecar-python", "pipe"),
        default="sidecar",
        help="what sits in front of the engine: the sidecar (its C relay where built), the "
        "sidecar with its Python relay, or (for the machine's floor) the harness's C byte pipe, "
        "which any relay on one core pays at least",
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run (< 30 s)")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.duration_s = min(args.duration_s, 2.0)
        args.max_duration_s = min(args.max_duration_s, 2.0)
        args.warmup_s = min(args.warmup_s, 1.0)
        args.rounds = 1
    for name in ("concurrency", "tokens", "rounds", "max_concurrency", "max_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if min(args.pace_ms, args.max_pace_ms, args.duration_s, args.max_duration_s) <= 0:
        parser.error("paces and durations must be > 0")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    children: list[Child] = []
    with tempfile.TemporaryDirectory(prefix="sidecar-native-") as tmp:
        try:
            result = bench(args, children, Path(tmp))
        finally:
            stop_all(children)
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
