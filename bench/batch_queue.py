"""Benchmark: the NIW queue's throughput and reaction time, for both stores; prints one JSON object.

Per store (SQLite file with synchronous=FULL; a real redis-server with appendfsync always):

- validate: the up-front check of every input line (pure, the same for both stores);
- enqueue: `create_batch` + `start_batch` of 100,000 items (two batches of 50,000, OpenAI's
  per-batch maximum), items/s;
- dispatch: the store's share of dispatching every item: `claim` in groups of 64 then `settle`
  in one commit per group (the dispatcher's default `commit_batch` is larger), items/s, then
  `finalize` writing the output files;
- service dispatch: the whole service (dispatcher, HTTP to a stub engine on 127.0.0.1, group
  commits) draining 10,000 items through a spot target with 64 slots, items/s;
- signal to dispatch: with 50 items queued and the region busy (utilisation 0.9), the
  utilisation drops to 0.4; measured from that moment to the stub engine receiving the item.
  `handling_ms`: the signal is handled at once (the dispatcher's step called directly);
  `end_to_end_ms`: the real signal loop with the default 1 s interval, which adds the wait for
  the next poll.

Usage: python bench/batch_queue.py [--items 100000] [--service-items 10000] [--samples 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetwarden.batch.config import BatchServiceConfig
from fleetwarden.batch.ids import new_batch_id, new_file_id
from fleetwarden.batch.records import BatchRecord, FileRecord, ItemResult, QueueKey, Settlement
from fleetwarden.batch.results import response_line
from fleetwarden.batch.service import BatchService, Overrides
from fleetwarden.batch.store import open_store
from fleetwarden.batch.store.base import BatchStore
from fleetwarden.batch.utilisation import FixedUtilisation
from fleetwarden.batch.validation import InputLimits, ValidInput, validate_input
from tests.batch.stub_engine import StubEngine
from tests.support.redis_server import running_redis

MODEL = "llama-3-8b"
QUEUE = QueueKey(MODEL, "eu-west")
PER_BATCH = 50_000


def input_file(n: int, prefix: str) -> bytes:
    text = "".join(
        json.dumps({"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": MODEL, "max_tokens": 64,
                             "messages": [{"role": "user", "content": f"summarise document {i}"}]}})
        + "\n"
        for i in range(n)
    )  # fmt: skip
    return text.encode()


@contextmanager
def stores(directory: Path) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """(name, store config) for a SQLite file and a fresh redis-server."""
    sqlite_cfg = {"kind": "sqlite", "path": str(directory / "bench.sqlite3"), "synchronous": "full"}
    with running_redis(directory / "redis") as server:
        yield [("sqlite", sqlite_cfg), ("redis", {"kind": "redis", "url": server.url})]


def store_throughput(store: BatchStore, items: int) -> dict[str, Any]:
    now = time.time()
    limits = InputLimits(max_line_bytes=1 << 20, max_lines=PER_BATCH)
    validate_s = enqueue_s = 0.0
    batch_ids = []
    for b in range(0, items, PER_BATCH):
        n = min(PER_BATCH, items - b)
        content = input_file(n, f"b{b}")
        start = time.perf_counter()
        checked = validate_input(content, "/v1/chat/completions", limits, {MODEL})
        validate_s += time.perf_counter() - start
        assert isinstance(checked, ValidInput)
        upload = FileRecord(new_file_id(), "bench", "in.jsonl", "batch", len(content), now, n)
        store.put_file(upload, content)
        batch = BatchRecord(new_batch_id(), "bench", "/v1/chat/completions", upload.id, "24h",
                            now, now + 86400, total=n)  # fmt: skip
        start = time.perf_counter()
        store.create_batch(batch, max_open_items=10**9)
        assert store.start_batch(batch.id, QUEUE, checked.items, now)
        enqueue_s += time.perf_counter() - start
        batch_ids.append(batch.id)
    body = {"choices": [{"message": {"content": "ok"}}], "usage": {"completion_tokens": 2}}
    dispatched = 0
    start = time.perf_counter()
    while True:
        claimed = store.claim(QUEUE, by_deadline=64, promoted=0, limit=64,
                              lease_until=now + 600)  # fmt: skip
        if not claimed:
            break
        lines = [response_line(i.batch_id, i.idx, i.custom_id, 200, "r", body) for i in claimed]
        settlements = [
            Settlement(i, ItemResult(True, line, 10, 2))
            for i, line in zip(claimed, lines, strict=True)
        ]
        store.settle(settlements, now)
        dispatched += len(claimed)
    dispatch_s = time.perf_counter() - start
    start = time.perf_counter()
    finalized = store.finalize_batches(now)
    finalize_s = time.perf_counter() - start
    assert dispatched == items
    assert sorted(finalized) == sorted(batch_ids)
    return {
        "validate_items_per_s": round(items / validate_s),
        "enqueue_items_per_s": round(items / enqueue_s),
        "dispatch_items_per_s": round(items / dispatch_s),
        "finalize_s": round(finalize_s, 2),
    }


def service_config(
    store: dict[str, Any], engine: StubEngine, interval_s: float, *, spot: bool
) -> BatchServiceConfig:
    targets: list[dict[str, Any]] = [
        {"model": MODEL, "region": "eu-west", "base_url": engine.base_url, "max_in_flight": 64,
         "utilisation": {"kind": "engine_metrics", "url": engine.metrics_url}},
    ]  # fmt: skip
    if spot:
        targets.append({"model": MODEL, "region": "eu-west", "kind": "spot",
                        "base_url": engine.base_url, "max_in_flight": 64})  # fmt: skip
    return BatchServiceConfig.model_validate(
        {
            "store": store,
            "auth": {"tokens": {"sk-bench": "bench"}},
            "quotas": {"default": {"max_queued_items": 10**9}},
            "targets": targets,
            "dispatch": {"signal_interval_s": interval_s, "maintenance_interval_s": 0.2},
        }
    )


async def queue_items(service: BatchService, n: int, prefix: str) -> None:
    now = service.clock.now()
    content = input_file(n, prefix)
    store = service.runner.store
    upload = FileRecord(new_file_id(), "bench", "in.jsonl", "batch", len(content), now, n)
    await service.runner.call(store.put_file, upload, content)
    batch = BatchRecord(new_batch_id(), "bench", "/v1/chat/completions", upload.id, "24h", now,
                        now + 86400, total=n)  # fmt: skip
    await service.runner.call(store.create_batch, batch, 10**9)
    await service.maintenance.validate_pending()


async def service_dispatch(store: dict[str, Any], n: int) -> float:
    """Items/s through the real dispatcher to the stub engine, spot target only."""
    engine = await StubEngine().start()
    busy = FixedUtilisation(1.0)
    service = BatchService(service_config(store, engine, 0.001, spot=True),
                           Overrides(sources={f"{MODEL}/eu-west/shared": busy}))  # fmt: skip
    await service.start("127.0.0.1", 0, loops=False)
    await queue_items(service, n, "svc")
    assert service.dispatcher is not None
    spot = service.dispatcher.targets[1]
    start = time.perf_counter()
    done = 0
    while done < n:
        done += len(await service.dispatcher.signal(spot))
        await asyncio.sleep(0)  # let answers arrive and free slots
        while spot.in_flight >= spot.config.max_in_flight:  # noqa: ASYNC110 (a tight spin)
            await asyncio.sleep(0.0005)
    await service.dispatcher.drain()
    elapsed = time.perf_counter() - start
    await service.stop()
    await engine.stop()
    return n / elapsed


def _summary(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    return {
        "p50": round(statistics.median(ordered), 2),
        "p99": round(ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))], 2),
        "mean": round(statistics.fmean(ordered), 2),
    }


async def signal_latency(store: dict[str, Any], samples: int, loops: bool) -> dict[str, float]:
    """Utilisation 0.9 -> 0.4, time until the stub engine receives the released item."""
    engine = await StubEngine().start()
    source = FixedUtilisation(0.9)
    service = BatchService(service_config(store, engine, 1.0, spot=False),
                           Overrides(sources={f"{MODEL}/eu-west/shared": source}))  # fmt: skip
    await service.start("127.0.0.1", 0, loops=loops)
    assert service.dispatcher is not None
    shared = service.dispatcher.targets[0]
    await queue_items(service, 2 * samples + 10, f"lat{int(loops)}")
    results = []
    phase = random.Random(7)  # where in the poll interval the capacity appears
    for _ in range(samples):
        engine.arrived.clear()
        await asyncio.sleep(0.05 if not loops else phase.uniform(0.0, 1.0))
        start = time.perf_counter()
        source.value = 0.4
        if not loops:
            await service.dispatcher.signal(shared)
        await engine.arrived.wait()
        results.append((engine.received_at[-1] - start) * 1000)
        source.value = 0.9
        await service.dispatcher.drain()
    await service.stop()
    await engine.stop()
    return _summary(results)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, stores(Path(tmp)) as available:
        for name, cfg in available:
            store = open_store(BatchServiceConfig(store=cfg).store)  # type: ignore[arg-type]
            figures = store_throughput(store, args.items)
            store.close()
            figures["service_dispatch_items_per_s"] = round(
                await service_dispatch(cfg, args.service_items)
            )
            figures["signal_to_dispatch_handling_ms"] = await signal_latency(
                cfg, args.samples, False
            )
            figures["signal_to_dispatch_end_to_end_ms"] = await signal_latency(
                cfg, max(5, args.samples // 2), True
            )
            out[name] = figures
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--service-items", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    stores_figures = asyncio.run(measure(args))
    print(
        json.dumps(
            {
                "benchmark": "batch_queue",
                "items": args.items,
                "service_items": args.service_items,
                "durability": {"sqlite": "WAL, synchronous=FULL", "redis": "appendfsync always"},
                "claim_group": 64,
                "signal_interval_s": 1.0,
                "stores": stores_figures,
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            }
        )
    )


if __name__ == "__main__":
    main()
