"""The SQLite store: one database file in WAL mode, for a single replica on a PersistentVolume.

Every public method is one `BEGIN IMMEDIATE ... COMMIT` transaction, so SQLite's atomic commit
gives the store contract directly: a kill -9 at any instant leaves either all or none of a
method's changes (schema and indexes: `sqlite_schema`).

`synchronous=FULL` (the default) fsyncs the WAL on every commit, so acknowledged writes also
survive power loss; the dispatcher commits results in groups to amortise that fsync.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from fleetwarden.batch.ids import new_lease_token
from fleetwarden.batch.records import (
    BatchRecord,
    BatchStatus,
    ClaimedItem,
    FileRecord,
    LineError,
    NewItem,
    QueueBacklog,
    QueueKey,
    Settlement,
)
from fleetwarden.batch.results import CANCELLED_MARKER, EXPIRED_MARKER
from fleetwarden.batch.store.assemble import assemble, encode_result
from fleetwarden.batch.store.base import (
    InvalidTransitionError,
    NotFoundError,
    Promotion,
    QuotaExceededError,
    StoreError,
    resolve_promotion,
)
from fleetwarden.batch.store.sqlite_schema import (
    SCHEMA,
    batch_from_row,
    claimed_items,
    insert_file,
    load_batch,
    requeue_leased,
)

_CURSOR = (
    "CASE WHEN ? IS NULL THEN 9e18 ELSE "
    "COALESCE((SELECT seq FROM {table} WHERE id = ? AND tenant = ?), -1) END"
)
"""The upper bound of a page: everything without a cursor, nothing after an unknown one (as in
the Redis store)."""
_ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
_LEASE = (
    "UPDATE items SET state = 'leased', token = ?, lease_until = ?, "
    "attempts = attempts + 1 WHERE (batch_id, idx) IN ({}) RETURNING *"
)
_P = ParamSpec("_P")
_T = TypeVar("_T")


def _translated(
    method: Callable[Concatenate[SqliteStore, _P], _T],
) -> Callable[Concatenate[SqliteStore, _P], _T]:
    """Turn sqlite3 errors into StoreError at the boundary (the transaction rolled back)."""

    @functools.wraps(method)
    def wrapper(self: SqliteStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite: {exc}") from exc

    return wrapper


def _promoted_batches(
    db: sqlite3.Connection, queue: QueueKey, promotion: Promotion
) -> list[tuple[float, int]]:
    """`(created_at, seq)` of the queue's running batches whose items `promotion` promotes,
    oldest first.

    Items of a batch share its creation time and deadline, so promotion is decided once per
    batch, over the few running batches rather than the queue's items; the items' own
    `created_at` (read through the primary key) is what `items_by_age` is then searched with.
    """
    rows = db.execute(
        "SELECT seq, expires_at, (SELECT created_at FROM items WHERE batch_id = b.id LIMIT 1) "
        "FROM batches AS b WHERE status = 'in_progress' AND pending_final IS NULL "
        "AND model = ? AND region = ?",
        (queue.model, queue.region),
    ).fetchall()
    return sorted(
        (created_at, seq)
        for seq, expires_at, created_at in rows
        if created_at is not None and promotion.promoted(created_at, expires_at)
    )


class SqliteStore:
    """`BatchStore` on one SQLite file."""

    def __init__(self, path: Path, synchronous: str = "full", busy_timeout_ms: int = 5000) -> None:
        try:
            self._db = sqlite3.connect(
                str(path),
                isolation_level=None,
                check_same_thread=False,
                timeout=busy_timeout_ms / 1000,
            )
            self._db.row_factory = sqlite3.Row
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":  # e.g. a filesystem without shared memory
                raise StoreError(f"sqlite: {path} cannot use WAL (journal_mode={mode})")
            self._db.execute(f"PRAGMA synchronous={'FULL' if synchronous == 'full' else 'NORMAL'}")
            self._db.executescript(SCHEMA)
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite: cannot open {path}: {exc}") from exc

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # Files ------------------------------------------------------------------------------------

    @_translated
    def put_file(self, record: FileRecord, content: bytes) -> None:
        with self._tx() as db:
            insert_file(db, record, content)

    @_translated
    def get_file(self, file_id: str) -> FileRecord | None:
        row = self._db.execute("SELECT meta FROM files WHERE id = ?", (file_id,)).fetchone()
        return FileRecord.from_json(row["meta"]) if row else None

    @_translated
    def file_content(self, file_id: str) -> bytes | None:
        row = self._db.execute("SELECT content FROM files WHERE id = ?", (file_id,)).fetchone()
        return bytes(row["content"]) if row else None

    @_translated
    def list_files(self, tenant: str, after: str | None, limit: int) -> list[FileRecord]:
        rows = self._db.execute(
            "SELECT meta FROM files WHERE tenant = ? AND seq < "
            f"{_CURSOR.format(table='files')} ORDER BY seq DESC LIMIT ?",
            (tenant, after, after, tenant, limit),
        ).fetchall()
        return [FileRecord.from_json(r["meta"]) for r in rows]

    @_translated
    def delete_file(self, file_id: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM files WHERE id = ?", (file_id,))

    # Batches ----------------------------------------------------------------------------------

    @_translated
    def create_batch(self, batch: BatchRecord, max_open_items: int) -> BatchRecord:
        with self._tx() as db:
            open_items = db.execute(
                "SELECT COALESCE(SUM(total - completed - failed), 0) FROM batches "
                f"WHERE tenant = ? AND status IN {_ACTIVE}",
                (batch.tenant,),
            ).fetchone()[0]
            if open_items + batch.total > max_open_items:
                raise QuotaExceededError(batch.tenant, open_items, batch.total, max_open_items)
            fields = batch.dynamic_fields()
            fields.pop("seq")
            names = ["id", "tenant", "static", "expires_at", *fields]
            values = [batch.id, batch.tenant, batch.static_json(), batch.expires_at]
            values += list(fields.values())
            cursor = db.execute(
                f"INSERT INTO batches ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                values,
            )
            batch.seq = int(cursor.lastrowid or 0)
        return batch

    @_translated
    def get_batch(self, batch_id: str) -> BatchRecord | None:
        return load_batch(self._db, batch_id)

    @_translated
    def list_batches(self, tenant: str, after: str | None, limit: int) -> list[BatchRecord]:
        rows = self._db.execute(
            "SELECT * FROM batches WHERE tenant = ? AND seq < "
            f"{_CURSOR.format(table='batches')} ORDER BY seq DESC LIMIT ?",
            (tenant, after, after, tenant, limit),
        ).fetchall()
        return [batch_from_row(r) for r in rows]

    @_translated
    def validating_batches(self) -> list[str]:
        rows = self._db.execute(
            "SELECT id FROM batches WHERE status = 'validating' ORDER BY seq"
        ).fetchall()
        return [r["id"] for r in rows]

    @_translated
    def start_batch(
        self, batch_id: str, queue: QueueKey, items: Sequence[NewItem], now: float
    ) -> bool:
        with self._tx() as db:
            batch = load_batch(db, batch_id)
            if batch is None or batch.status is not BatchStatus.VALIDATING:
                return False
            if len(items) != batch.total:
                raise StoreError(f"batch {batch_id}: {len(items)} items, expected {batch.total}")
            key = queue.encode()
            db.executemany(
                "INSERT INTO items (batch_id, idx, batch_seq, tenant, queue, custom_id, request, "
                "created_at, deadline, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued')",
                (
                    (batch_id, it.idx, batch.seq, batch.tenant, key, it.custom_id,
                     it.request_json, batch.created_at, batch.expires_at)
                    for it in items
                ),
            )  # fmt: skip
            db.execute(
                "UPDATE batches SET status = 'in_progress', in_progress_at = ?, model = ?, "
                "region = ? WHERE id = ?",
                (now, queue.model, queue.region, batch_id),
            )
        return True

    @_translated
    def fail_batch(
        self,
        batch_id: str,
        errors: Sequence[LineError],
        error_file: FileRecord | None,
        error_content: bytes,
        now: float,
    ) -> bool:
        with self._tx() as db:
            batch = load_batch(db, batch_id)
            if batch is None or batch.status is not BatchStatus.VALIDATING:
                return False
            if error_file is not None:
                insert_file(db, error_file, error_content)
            db.execute(
                "UPDATE batches SET status = 'failed', failed_at = ?, errors = ?, "
                "error_file_id = ? WHERE id = ?",
                (
                    now,
                    json.dumps([e.to_dict() for e in errors]),
                    error_file.id if error_file else None,
                    batch_id,
                ),
            )
        return True

    @_translated
    def cancel_batch(self, batch_id: str, now: float) -> BatchRecord:
        with self._tx() as db:
            batch = load_batch(db, batch_id)
            if batch is None:
                raise NotFoundError(batch_id)
            if batch.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
                return batch
            if batch.status is BatchStatus.VALIDATING:
                db.execute(
                    "UPDATE batches SET status = 'cancelled', cancelling_at = ?, cancelled_at = ? "
                    "WHERE id = ?",
                    (now, now, batch_id),
                )
            elif batch.status is BatchStatus.IN_PROGRESS and batch.pending_final is None:
                cancelled = db.execute(
                    "UPDATE items SET state = 'done', result = ? "
                    "WHERE batch_id = ? AND state = 'queued'",
                    (CANCELLED_MARKER, batch_id),
                ).rowcount
                db.execute(
                    "UPDATE batches SET status = 'cancelling', cancelling_at = ?, "
                    "pending_final = 'cancelled', failed = failed + ? WHERE id = ?",
                    (now, cancelled, batch_id),
                )
            else:
                raise InvalidTransitionError(batch_id, batch.status, "cancel", batch.pending_final)
            updated = load_batch(db, batch_id)
        assert updated is not None
        return updated

    # Dispatch ---------------------------------------------------------------------------------

    @_translated
    def claim(
        self,
        queue: QueueKey,
        *,
        by_deadline: int,
        promoted: int,
        limit: int,
        lease_until: float,
        promotion: Promotion | None = None,
    ) -> list[ClaimedItem]:
        cut = resolve_promotion(promoted, promotion)
        token = new_lease_token()
        key = queue.encode()
        claimed: list[ClaimedItem] = []
        with self._tx() as db:
            take = min(promoted, limit)
            if take > 0 and cut is not None:
                for created_at, seq in _promoted_batches(db, queue, cut):
                    rows = db.execute(
                        _LEASE.format(
                            "SELECT batch_id, idx FROM items WHERE queue = ? AND state = 'queued' "
                            "AND created_at = ? AND batch_seq = ? ORDER BY idx LIMIT ?"
                        ),
                        (token, lease_until, key, created_at, seq, take - len(claimed)),
                    ).fetchall()
                    claimed += claimed_items(rows, queue, lambda r: ())
                    if len(claimed) >= take:
                        break
            take = min(by_deadline, limit - len(claimed))
            if take > 0:
                rows = db.execute(
                    _LEASE.format(
                        "SELECT batch_id, idx FROM items WHERE queue = ? AND state = 'queued' "
                        "ORDER BY deadline, batch_seq, idx LIMIT ?"
                    ),
                    (token, lease_until, key, take),
                ).fetchall()
                claimed += claimed_items(rows, queue, lambda r: (r["deadline"], r["batch_seq"]))
        return claimed

    @_translated
    def settle(self, settlements: Sequence[Settlement], now: float) -> list[bool]:
        applied: list[bool] = []
        counts: dict[str, list[int]] = {}  # batch -> completed, failed, tokens in, tokens out
        with self._tx() as db:
            for s in settlements:
                item = s.item
                where = "WHERE batch_id = ? AND idx = ? AND state = 'leased' AND token = ?"
                keys = (item.batch_id, item.idx, item.token)
                if s.result is None:
                    n = db.execute(
                        f"UPDATE items SET lease_until = ?, attempts = MAX(0, attempts - ?) {where}",
                        (s.retry_at, 1 if s.refund else 0, *keys),
                    )
                    applied.append(n.rowcount == 1)
                    continue
                n = db.execute(
                    f"UPDATE items SET state = 'done', result = ?, token = NULL, "
                    f"lease_until = NULL {where}",
                    (encode_result(s.result.ok, s.result.line), *keys),
                )
                ok = n.rowcount == 1
                applied.append(ok)
                if ok:
                    r = s.result
                    total = counts.setdefault(item.batch_id, [0, 0, 0, 0])
                    total[0 if r.ok else 1] += 1
                    total[2] += r.input_tokens
                    total[3] += r.output_tokens
            for batch_id, (completed, failed, tokens_in, tokens_out) in counts.items():
                db.execute(
                    "UPDATE batches SET completed = completed + ?, failed = failed + ?, "
                    "input_tokens = input_tokens + ?, output_tokens = output_tokens + ? "
                    "WHERE id = ?",
                    (completed, failed, tokens_in, tokens_out, batch_id),
                )
                db.execute(
                    "UPDATE batches SET status = 'finalizing', finalizing_at = ?, "
                    "pending_final = 'completed' WHERE id = ? AND status = 'in_progress' "
                    "AND pending_final IS NULL AND completed + failed >= total",
                    (now, batch_id),
                )
        return applied

    @_translated
    def requeue(self, item: ClaimedItem, refund: bool, now: float) -> bool:
        keys = (item.batch_id, item.idx)
        with self._tx() as db:
            if refund:
                db.execute(
                    "UPDATE items SET attempts = MAX(0, attempts - 1) "
                    "WHERE batch_id = ? AND idx = ? AND state != 'done'",
                    keys,
                )
            mine = "batch_id = ? AND idx = ? AND token = ?"
            return requeue_leased(db, mine, (*keys, item.token)) == 1

    @_translated
    def recover_leases(self, now: float, everything: bool = False) -> int:
        with self._tx() as db:
            return requeue_leased(db, "lease_until <= ?", (float("inf") if everything else now,))

    @_translated
    def expire_batches(self, now: float) -> list[str]:
        expired: list[str] = []
        with self._tx() as db:
            rows = db.execute(
                "SELECT id, status FROM batches WHERE status IN ('validating', 'in_progress') "
                "AND pending_final IS NULL AND expires_at <= ?",
                (now,),
            ).fetchall()
            for row in rows:
                batch_id = row["id"]
                expired.append(batch_id)
                if row["status"] == "validating":
                    db.execute(
                        "UPDATE batches SET status = 'expired', expired_at = ? WHERE id = ?",
                        (now, batch_id),
                    )
                    continue
                n = db.execute(
                    "UPDATE items SET state = 'done', result = ?, token = NULL, lease_until = NULL "
                    "WHERE batch_id = ? AND state != 'done'",
                    (EXPIRED_MARKER, batch_id),
                ).rowcount
                db.execute(
                    "UPDATE batches SET failed = failed + ?, expired_at = ?, "
                    "pending_final = 'expired' WHERE id = ?",
                    (n, now, batch_id),
                )
        return expired

    @_translated
    def finalize_batches(self, now: float) -> list[str]:
        ready = [
            r["id"]
            for r in self._db.execute(
                "SELECT id FROM batches WHERE pending_final IS NOT NULL "
                "AND completed + failed >= total ORDER BY seq"
            ).fetchall()
        ]
        done: list[str] = []
        for batch_id in ready:
            with self._tx() as db:
                batch = load_batch(db, batch_id)
                if batch is None or batch.pending_final is None or batch.open_items > 0:
                    continue
                rows = db.execute(
                    "SELECT idx, custom_id, result FROM items WHERE batch_id = ?", (batch_id,)
                ).fetchall()
                files = assemble(batch, ((r[0], r[1], r[2]) for r in rows), now)
                if files.output is not None:
                    insert_file(db, files.output, files.output_content)
                if files.error is not None:
                    insert_file(db, files.error, files.error_content)
                final = batch.pending_final
                stamp = f"{final.value}_at"
                db.execute(
                    f"UPDATE batches SET status = ?, {stamp} = COALESCE({stamp}, ?), "
                    "pending_final = NULL, output_file_id = ?, error_file_id = ? WHERE id = ?",
                    (
                        final.value,
                        now,
                        files.output.id if files.output else None,
                        files.error.id if files.error else None,
                        batch_id,
                    ),
                )
                db.execute("DELETE FROM items WHERE batch_id = ?", (batch_id,))
            done.append(batch_id)
        return done

    @_translated
    def backlog(self, now: float, due_within_s: Sequence[float]) -> dict[QueueKey, QueueBacklog]:
        due_sql = ", SUM(deadline <= ?)" * len(due_within_s)
        queued = self._db.execute(
            f"SELECT queue, COUNT(*), MIN(created_at){due_sql} FROM items "
            "WHERE state = 'queued' GROUP BY queue",
            [now + s for s in due_within_s],
        ).fetchall()
        leased = dict(
            self._db.execute(
                "SELECT queue, COUNT(*) FROM items WHERE state = 'leased' GROUP BY queue"
            ).fetchall()
        )
        found: dict[QueueKey, QueueBacklog] = {}
        for row in queued:
            due = tuple(zip(due_within_s, (int(v or 0) for v in tuple(row)[3:]), strict=True))
            found[QueueKey.decode(row[0])] = QueueBacklog(
                int(row[1]), int(leased.pop(row[0], 0)), float(row[2]), due
            )
        for key, count in leased.items():
            due = tuple((s, 0) for s in due_within_s)
            found[QueueKey.decode(key)] = QueueBacklog(0, int(count), None, due)
        return found
