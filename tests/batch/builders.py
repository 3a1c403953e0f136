"""Builders for batch test data: input lines, files and batches."""

from __future__ import annotations

import json
from typing import Any

from fleetwarden.batch.ids import new_batch_id, new_file_id
from fleetwarden.batch.records import BatchRecord, FileRecord, NewItem, QueueKey
from fleetwarden.batch.store.base import BatchStore

MODEL = "llama-3-8b"
QUEUE = QueueKey(MODEL, "eu-west")


def chat_line(custom_id: str, model: str = MODEL, **body: Any) -> dict[str, Any]:
    """One valid chat-completions input line."""
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": custom_id}], **body},
    }


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def new_items(n: int, prefix: str = "req") -> list[NewItem]:
    return [
        NewItem(i, f"{prefix}-{i}", json.dumps(chat_line(f"{prefix}-{i}"), separators=(",", ":")))
        for i in range(n)
    ]


def started_batch(
    store: BatchStore,
    n: int,
    *,
    now: float,
    tenant: str = "team-a",
    window_s: float = 86400.0,
    queue: QueueKey = QUEUE,
    prefix: str = "req",
) -> BatchRecord:
    """A batch of `n` chat items, created and started (queued) at `now`."""
    content = jsonl([chat_line(f"{prefix}-{i}") for i in range(n)])
    upload = FileRecord(new_file_id(), tenant, "in.jsonl", "batch", len(content), now, n)
    store.put_file(upload, content)
    batch = BatchRecord(
        id=new_batch_id(),
        tenant=tenant,
        endpoint="/v1/chat/completions",
        input_file_id=upload.id,
        completion_window="24h",
        created_at=now,
        expires_at=now + window_s,
        total=n,
    )
    store.create_batch(batch, max_open_items=10**9)
    assert store.start_batch(batch.id, queue, new_items(n, prefix), now)
    found = store.get_batch(batch.id)
    assert found is not None
    return found
