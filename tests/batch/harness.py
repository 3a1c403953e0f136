"""The batch service in the test process: a config pointing at the stub engine, a running
service on a free port, and an openai client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai

from fleetwarden.batch.config import BatchServiceConfig
from fleetwarden.batch.service import BatchService, Overrides
from tests.batch.builders import MODEL

TOKEN_A = "sk-test-team-a"
TOKEN_B = "sk-test-team-b"


def service_config(
    store: dict[str, Any], engine_url: str, *, spot_url: str | None = None, **sections: Any
) -> BatchServiceConfig:
    """Two tenants, one shared target (and optionally a spot one) in eu-west, fast timings.

    `sections` replace or extend top-level sections, e.g. `quotas={...}`, `dispatch={...}`.
    """
    targets: list[dict[str, Any]] = [
        {
            "model": MODEL,
            "region": "eu-west",
            "base_url": engine_url,
            "max_in_flight": 8,
            "utilisation": {"kind": "engine_metrics", "url": f"{engine_url}/metrics"},
        },
    ]
    if spot_url is not None:
        targets.append(
            {"model": MODEL, "region": "eu-west", "kind": "spot", "base_url": spot_url,
             "max_in_flight": 4}
        )  # fmt: skip
    raw: dict[str, Any] = {
        "store": store,
        "auth": {"tokens": {TOKEN_A: "team-a", TOKEN_B: "team-b"}},
        "targets": targets,
        "retry": {"max_attempts": 3, "base_delay_s": 5.0, "max_delay_s": 60.0},
        "dispatch": {
            "signal_interval_s": 0.02,
            "maintenance_interval_s": 0.05,
            "request_timeout_s": 5.0,
            "lease_s": 30.0,
        },
    }
    for name, value in sections.items():
        if isinstance(value, dict) and isinstance(raw.get(name), dict):
            raw[name] = {**raw[name], **value}
        else:
            raw[name] = value
    return BatchServiceConfig.model_validate(raw)


def sqlite_store(tmp_path: Path) -> dict[str, Any]:
    return {"kind": "sqlite", "path": str(tmp_path / "batch.sqlite3")}


@asynccontextmanager
async def running_service(
    config: BatchServiceConfig, overrides: Overrides | None = None, *, loops: bool = True
) -> AsyncIterator[BatchService]:
    service = BatchService(config, overrides)
    await service.start("127.0.0.1", 0, loops=loops)
    try:
        yield service
    finally:
        await service.stop()


def client(service: BatchService, token: str = TOKEN_A) -> openai.AsyncOpenAI:
    """The official client, pointed at the service, without its own retries."""
    return openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{service.port}/v1", api_key=token, max_retries=0, timeout=30
    )


async def create_batch(service: BatchService, content: bytes, window: str = "24h") -> str:
    """Upload `content` as an input file (any bytes: tests send lines no client would build)
    and create a batch from it through the API; returns its id. It is still validating."""
    async with client(service) as api:
        uploaded = await api.files.create(file=("in.jsonl", content), purpose="batch")
        batch = await api.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window=window,  # type: ignore[arg-type]
        )
    return batch.id
