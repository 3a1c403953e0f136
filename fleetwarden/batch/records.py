"""The batch service's data types, shared by the API, the stores and the dispatcher.

Plain dataclasses with no behaviour beyond (de)serialisation: both stores persist the same fields
under the same names, so a record read from SQLite and one read from Redis compare equal.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
"""Endpoints a batch may target (the OpenAI Batch API also has embeddings; engines here do not)."""


class BatchStatus(StrEnum):
    """The OpenAI batch statuses, in the order a batch moves through them."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


FINAL_STATUSES = frozenset(
    {BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}
)


class FileKind(StrEnum):
    """Where a file came from: a client upload, or a batch's output or error file."""

    UPLOAD = "upload"
    OUTPUT = "output"
    ERROR = "error"


@dataclass(frozen=True, slots=True, order=True)
class QueueKey:
    """One dispatch queue: the NIW items of one model waiting for capacity in one region."""

    model: str
    region: str

    def encode(self) -> str:
        """A single string for store keys; config validation keeps `|` out of both parts."""
        return f"{self.model}|{self.region}"

    @classmethod
    def decode(cls, text: str) -> QueueKey:
        """The inverse of `encode`."""
        model, _, region = text.partition("|")
        return cls(model, region)


@dataclass(frozen=True, slots=True)
class FileRecord:
    """A file's metadata; the content is stored next to it, bounded by the tenant's quota."""

    id: str
    tenant: str
    filename: str
    purpose: str
    size_bytes: int
    created_at: float
    lines: int
    kind: FileKind = FileKind.UPLOAD
    batch_id: str | None = None

    def to_json(self) -> str:
        """Serialised form for the stores."""
        return json.dumps(
            {
                "id": self.id,
                "tenant": self.tenant,
                "filename": self.filename,
                "purpose": self.purpose,
                "bytes": self.size_bytes,
                "created_at": self.created_at,
                "lines": self.lines,
                "kind": self.kind.value,
                "batch_id": self.batch_id,
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> FileRecord:
        """The inverse of `to_json`."""
        raw = json.loads(text)
        return cls(
            id=raw["id"],
            tenant=raw["tenant"],
            filename=raw["filename"],
            purpose=raw["purpose"],
            size_bytes=int(raw["bytes"]),
            created_at=float(raw["created_at"]),
            lines=int(raw["lines"]),
            kind=FileKind(raw["kind"]),
            batch_id=raw["batch_id"],
        )


@dataclass(frozen=True, slots=True)
class LineError:
    """One problem with a batch, in the OpenAI `errors.data[]` shape."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI `BatchError` object."""
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LineError:
        """The inverse of `to_dict`."""
        return cls(raw["code"], raw["message"], raw.get("line"), raw.get("param"))


TIMESTAMP_FIELDS = (
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


@dataclass(slots=True)
class BatchRecord:
    """A batch. Static fields are set at creation; the rest move with its status.

    `pending_final` is the status the batch takes once its last item is settled and its output
    and error files are written (completed, cancelled or expired); the client sees the final
    status and the file ids appear together, never a final status without its files.
    """

    id: str
    tenant: str
    endpoint: str
    input_file_id: str
    completion_window: str
    created_at: float
    expires_at: float
    total: int
    metadata: dict[str, str] = field(default_factory=dict)
    status: BatchStatus = BatchStatus.VALIDATING
    seq: int = 0
    model: str | None = None
    region: str | None = None
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    in_progress_at: float | None = None
    finalizing_at: float | None = None
    completed_at: float | None = None
    failed_at: float | None = None
    expired_at: float | None = None
    cancelling_at: float | None = None
    cancelled_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: tuple[LineError, ...] = ()
    pending_final: BatchStatus | None = None

    @property
    def open_items(self) -> int:
        """Items not yet settled (queued, in flight or waiting to retry)."""
        return self.total - self.completed - self.failed

    @property
    def queue(self) -> QueueKey | None:
        """The dispatch queue, known once validation has read the model."""
        if self.model is None or self.region is None:
            return None
        return QueueKey(self.model, self.region)

    def static_json(self) -> str:
        """Fields that never change after creation, stored as one JSON value."""
        return json.dumps(
            {
                "id": self.id,
                "tenant": self.tenant,
                "endpoint": self.endpoint,
                "input_file_id": self.input_file_id,
                "completion_window": self.completion_window,
                "created_at": self.created_at,
                "expires_at": self.expires_at,
                "metadata": self.metadata,
            }
        )

    def dynamic_fields(self) -> dict[str, str | int | float | None]:
        """Fields that change, one column (SQLite) or hash field (Redis) each."""
        fields: dict[str, str | int | float | None] = {
            "status": self.status.value,
            "seq": self.seq,
            "model": self.model,
            "region": self.region,
            "total": self.total,
            "completed": self.completed,
            "failed": self.failed,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "errors": json.dumps([e.to_dict() for e in self.errors]) if self.errors else None,
            "pending_final": self.pending_final.value if self.pending_final else None,
        }
        for name in TIMESTAMP_FIELDS:
            fields[name] = getattr(self, name)
        return fields

    @classmethod
    def from_fields(cls, static: str | bytes, dynamic: Mapping[str, Any]) -> BatchRecord:
        """Rebuild a record from `static_json` and `dynamic_fields` as a store returns them.

        Values may come back as strings (Redis) or native types (SQLite); empty strings mean
        unset, because Redis hashes cannot hold a null.
        """
        raw = json.loads(static)

        def text(name: str) -> str | None:
            value = dynamic.get(name)
            if value is None or value == "":
                return None
            return value.decode() if isinstance(value, bytes) else str(value)

        def number(name: str) -> float | None:
            value = text(name)
            return None if value is None else float(value)

        errors_json = text("errors")
        pending = text("pending_final")
        record = cls(
            id=raw["id"],
            tenant=raw["tenant"],
            endpoint=raw["endpoint"],
            input_file_id=raw["input_file_id"],
            completion_window=raw["completion_window"],
            created_at=float(raw["created_at"]),
            expires_at=float(raw["expires_at"]),
            total=int(number("total") or 0),
            metadata=dict(raw.get("metadata") or {}),
            status=BatchStatus(text("status") or BatchStatus.VALIDATING.value),
            seq=int(number("seq") or 0),
            model=text("model"),
            region=text("region"),
            completed=int(number("completed") or 0),
            failed=int(number("failed") or 0),
            input_tokens=int(number("input_tokens") or 0),
            output_tokens=int(number("output_tokens") or 0),
            output_file_id=text("output_file_id"),
            error_file_id=text("error_file_id"),
            errors=tuple(LineError.from_dict(e) for e in json.loads(errors_json))
            if errors_json
            else (),
            pending_final=BatchStatus(pending) if pending else None,
        )
        for name in TIMESTAMP_FIELDS:
            setattr(record, name, number(name))
        return record


@dataclass(frozen=True, slots=True)
class NewItem:
    """A validated input line, ready to be queued. `request_json` is the canonical line."""

    idx: int
    custom_id: str
    request_json: str


def item_member(batch_id: str, idx: int) -> str:
    """The item's key inside queues; zero-padded so equal deadlines keep input order."""
    return f"{batch_id}:{idx:08d}"


def split_member(member: str) -> tuple[str, int]:
    """The inverse of `item_member`."""
    batch_id, _, idx = member.rpartition(":")
    return batch_id, int(idx)


@dataclass(frozen=True, slots=True)
class ClaimedItem:
    """An item leased to the dispatcher: it must be settled with the same `token`."""

    batch_id: str
    idx: int
    custom_id: str
    url: str
    body: dict[str, Any]
    tenant: str
    created_at: float
    deadline: float
    attempts: int
    token: str
    queue: QueueKey

    @property
    def member(self) -> str:
        """The key inside queues and leases."""
        return item_member(self.batch_id, self.idx)


@dataclass(frozen=True, slots=True)
class ItemResult:
    """A finished item: one line of the output file (`ok`) or of the error file."""

    ok: bool
    line: str
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Settlement:
    """What to commit for a claimed item: a result, or a retry no earlier than `retry_at`."""

    item: ClaimedItem
    result: ItemResult | None = None
    retry_at: float | None = None
    refund: bool = False
    """With `retry_at`: the attempt was interrupted (an evicted spot pod, a draining engine), so
    the store takes it back from the item's attempt count; the item did nothing wrong."""

    def __post_init__(self) -> None:
        """Refuse what no store could commit: a settlement that is neither or both, or a retry
        with no finite time (SQLite would store a lease no recovery ever matches, and Redis would
        refuse it as a store error the committer retries forever, holding up every commit)."""
        if (self.result is None) == (self.retry_at is None):
            raise ValueError("a Settlement is a result or a retry (retry_at), exactly one")
        if self.retry_at is not None and not math.isfinite(self.retry_at):
            raise ValueError(f"a retry needs a finite retry_at, not {self.retry_at!r}")
        if self.refund and self.retry_at is None:
            raise ValueError("only a retry is refunded (refund needs retry_at)")


@dataclass(frozen=True, slots=True)
class QueueBacklog:
    """One queue's backlog: the inputs of the NIW metrics and of spot sizing.

    `due` is cumulative: `(within_s, n)` means n queued items have a deadline within `within_s`
    seconds from now.
    """

    queued: int
    in_flight: int
    oldest_created_at: float | None
    due: tuple[tuple[float, int], ...] = ()
