"""Records as OpenAI API objects (pure): the Batch, File and list shapes the openai client parses."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from fleetwarden.batch.records import TIMESTAMP_FIELDS, BatchRecord, FileRecord

_T = TypeVar("_T")


def _ts(value: float | None) -> int | None:
    return None if value is None else int(value)


def batch_object(batch: BatchRecord) -> dict[str, Any]:
    """The OpenAI `Batch` object."""
    shown: dict[str, Any] = {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": batch.model,
        "errors": {"object": "list", "data": [e.to_dict() for e in batch.errors]}
        if batch.errors
        else None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status.value,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": _ts(batch.created_at),
        "expires_at": _ts(batch.expires_at),
        "request_counts": {
            "total": batch.total,
            "completed": batch.completed,
            "failed": batch.failed,
        },
        "usage": {
            "input_tokens": batch.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": batch.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": batch.input_tokens + batch.output_tokens,
        },
        "metadata": batch.metadata or None,
    }
    for name in TIMESTAMP_FIELDS:
        shown[name] = _ts(getattr(batch, name))
    return shown


def file_object(record: FileRecord) -> dict[str, Any]:
    """The OpenAI `File` object."""
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.size_bytes,
        "created_at": int(record.created_at),
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def list_object(
    rows: Sequence[_T], limit: int, render: Callable[[_T], dict[str, Any]]
) -> dict[str, Any]:
    """A cursor page from `limit + 1` rows: the extra row only says there is more."""
    page = [render(row) for row in rows[:limit]]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(rows) > limit,
    }
