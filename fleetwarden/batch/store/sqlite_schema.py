"""The SQLite store's schema, row conversions and the statements two of its methods share.

Items live in one table; partial indexes over `state = 'queued'` give each queue its deadline
order and its age order, and one over `state = 'leased'` finds expired leases without scanning
finished items.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

from fleetwarden.batch.records import BatchRecord, ClaimedItem, FileRecord, QueueKey
from fleetwarden.batch.results import CANCELLED_MARKER

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    meta TEXT NOT NULL,
    content BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS files_by_tenant ON files(tenant, seq);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    static TEXT NOT NULL,
    expires_at REAL NOT NULL,
    status TEXT NOT NULL,
    model TEXT, region TEXT,
    total INTEGER NOT NULL, completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
    output_file_id TEXT, error_file_id TEXT, errors TEXT, pending_final TEXT,
    in_progress_at REAL, finalizing_at REAL, completed_at REAL, failed_at REAL,
    expired_at REAL, cancelling_at REAL, cancelled_at REAL
);
CREATE INDEX IF NOT EXISTS batches_by_tenant ON batches(tenant, seq);
CREATE INDEX IF NOT EXISTS batches_by_status ON batches(status, expires_at);
CREATE TABLE IF NOT EXISTS items (
    batch_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    batch_seq INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    queue TEXT NOT NULL,
    custom_id TEXT NOT NULL,
    request TEXT NOT NULL,
    created_at REAL NOT NULL,
    deadline REAL NOT NULL,
    state TEXT NOT NULL,
    token TEXT,
    lease_until REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    result TEXT,
    PRIMARY KEY (batch_id, idx)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS items_by_deadline
    ON items(queue, deadline, batch_seq, idx) WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS items_by_age
    ON items(queue, created_at, batch_seq, idx) WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS items_by_lease ON items(lease_until) WHERE state = 'leased';
"""


def insert_file(db: sqlite3.Connection, record: FileRecord, content: bytes) -> None:
    db.execute(
        "INSERT INTO files (id, tenant, meta, content) VALUES (?, ?, ?, ?)",
        (record.id, record.tenant, record.to_json(), content),
    )


def batch_from_row(row: sqlite3.Row) -> BatchRecord:
    return BatchRecord.from_fields(row["static"], dict(zip(row.keys(), row, strict=True)))


def load_batch(db: sqlite3.Connection, batch_id: str) -> BatchRecord | None:
    row = db.execute("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone()
    return batch_from_row(row) if row else None


def claimed_items(
    rows: list[sqlite3.Row], queue: QueueKey, order: Callable[[sqlite3.Row], tuple[Any, ...]]
) -> list[ClaimedItem]:
    """Rows from `UPDATE ... RETURNING` (in no particular order) as claimed items, in order."""
    items = []
    for row in sorted(rows, key=lambda r: (*order(r), r["idx"])):
        request = json.loads(row["request"])
        items.append(
            ClaimedItem(
                batch_id=row["batch_id"],
                idx=row["idx"],
                custom_id=row["custom_id"],
                url=request["url"],
                body=request["body"],
                tenant=row["tenant"],
                created_at=row["created_at"],
                deadline=row["deadline"],
                attempts=row["attempts"],
                token=row["token"],
                queue=queue,
            )
        )
    return items


def requeue_leased(db: sqlite3.Connection, where: str, args: tuple[object, ...]) -> int:
    """Send the leased items that `where` selects back to their queue, or settle them as
    cancelled if their batch is being cancelled; how many (`recover_leases` and `requeue`)."""
    rows = db.execute(
        "UPDATE items SET state = 'done', result = ?, token = NULL, lease_until = NULL "
        f"WHERE state = 'leased' AND {where} AND batch_id IN "
        "(SELECT id FROM batches WHERE pending_final = 'cancelled') RETURNING batch_id",
        (CANCELLED_MARKER, *args),
    ).fetchall()
    for row in rows:
        db.execute("UPDATE batches SET failed = failed + 1 WHERE id = ?", (row["batch_id"],))
    requeued = db.execute(
        "UPDATE items SET state = 'queued', token = NULL, lease_until = NULL "
        f"WHERE state = 'leased' AND {where}",
        args,
    ).rowcount
    return int(requeued) + len(rows)
