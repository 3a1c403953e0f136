"""The Redis store, for HA: the batch pod keeps no state, Redis (with its replica) holds it all.

Item moves run as Lua scripts (`redis_scripts`), which Redis executes atomically; bulk writes that
depend on a batch's status (start, fail, finalise) use WATCH + MULTI/EXEC, so they apply whole or
not at all. Durability comes from Redis: run it with `appendonly yes` and `appendfsync always`
(checked at startup, with a warning), and set `replicas_ack` to wait for a replica as well.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import redis

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
    item_member,
    split_member,
)
from fleetwarden.batch.store import redis_scripts
from fleetwarden.batch.store.assemble import assemble, encode_result
from fleetwarden.batch.store.base import (
    InvalidTransitionError,
    NotFoundError,
    Promotion,
    QuotaExceededError,
    StoreError,
    resolve_promotion,
)

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")
_CHUNK = 2000
"""Items per command when queueing a batch: fast, yet no command holds Redis for long."""


def _translated(
    method: Callable[Concatenate[RedisStore, _P], _T],
) -> Callable[Concatenate[RedisStore, _P], _T]:
    """Turn redis-py errors into StoreError at the boundary."""

    @functools.wraps(method)
    def wrapper(self: RedisStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return method(self, *args, **kwargs)
        except redis.RedisError as exc:
            raise StoreError(f"redis: {exc}") from exc

    return wrapper


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _field(idx: int) -> str:
    return f"{idx:08d}"


class RedisStore:
    """`BatchStore` on one Redis database."""

    def __init__(
        self,
        url: str,
        prefix: str = "fwb",
        replicas_ack: int = 0,
        ack_timeout_ms: int = 1000,
        socket_timeout_s: float = 10.0,
    ) -> None:
        self._r = redis.Redis.from_url(url, socket_timeout=socket_timeout_s)
        self._p = prefix
        self._replicas_ack = replicas_ack
        self._ack_timeout_ms = ack_timeout_ms
        self._scripts = {n: self._r.register_script(s) for n, s in redis_scripts.SCRIPTS.items()}
        self._warn_if_not_durable()
        try:  # running batches of a database written before the promotion index existed
            indexed = int(self._r.eval(redis_scripts.INDEX_BATCHES, 0, self._p))
        except redis.RedisError as exc:
            raise StoreError(f"redis: {exc}") from exc
        if indexed:
            log.info("indexed %d running batches for promotion", indexed)

    def _warn_if_not_durable(self) -> None:
        try:
            config = cast(dict[str, str], self._r.config_get("append*"))
        except redis.ResponseError:  # CONFIG disabled (managed Redis): cannot check
            return
        except redis.RedisError as exc:
            raise StoreError(f"redis: {exc}") from exc
        if config.get("appendonly") != "yes" or config.get("appendfsync") != "always":
            log.warning(
                "redis runs with appendonly=%s appendfsync=%s: acknowledged batch writes can be "
                "lost if Redis crashes; use appendonly yes and appendfsync always",
                config.get("appendonly"),
                config.get("appendfsync"),
            )

    def close(self) -> None:
        self._r.close()

    def _k(self, *parts: str) -> str:
        return ":".join((self._p, *parts))

    def _run(self, name: str, *args: Any) -> Any:
        return self._scripts[name](keys=[], args=[self._p, *args])

    def _acked(self) -> None:
        """Wait for replicas after a write, if configured. Fewer acks or a failed WAIT is logged,
        never raised: the write happened, and a StoreError is retried as if it had not."""
        if not self._replicas_ack:
            return
        try:
            got = int(self._r.wait(self._replicas_ack, self._ack_timeout_ms))
        except redis.RedisError as exc:
            return log.warning("waiting for redis replicas failed after a write: %s", exc)
        if got < self._replicas_ack:
            log.warning("only %d of %d redis replicas acknowledged", got, self._replicas_ack)

    # Files ------------------------------------------------------------------------------------

    def _queue_file(self, pipe: Any, record: FileRecord, content: bytes) -> None:
        seq = int(self._r.incr(self._k("fseq")))
        pipe.set(self._k("file", record.id), record.to_json())
        pipe.set(self._k("filedata", record.id), content)
        pipe.zadd(self._k("tfiles", record.tenant), {record.id: seq})

    @_translated
    def put_file(self, record: FileRecord, content: bytes) -> None:
        with self._r.pipeline(transaction=True) as pipe:
            self._queue_file(pipe, record, content)
            pipe.execute()
        self._acked()

    @_translated
    def get_file(self, file_id: str) -> FileRecord | None:
        raw = self._r.get(self._k("file", file_id))
        return FileRecord.from_json(cast(bytes, raw)) if raw else None

    @_translated
    def file_content(self, file_id: str) -> bytes | None:
        return cast(bytes | None, self._r.get(self._k("filedata", file_id)))

    def _page(self, zset: str, after: str | None, limit: int) -> list[str]:
        top: str | float = "+inf"
        if after is not None:
            score = self._r.zscore(zset, after)
            if score is None:
                return []
            top = f"({score}"
        ids = self._r.zrevrangebyscore(zset, top, "-inf", start=0, num=limit)
        return [_text(i) for i in cast(list[bytes], ids)]

    @_translated
    def list_files(self, tenant: str, after: str | None, limit: int) -> list[FileRecord]:
        ids = self._page(self._k("tfiles", tenant), after, limit)
        raws = (
            cast(list[bytes | None], self._r.mget([self._k("file", i) for i in ids])) if ids else []
        )
        return [FileRecord.from_json(raw) for raw in raws if raw]

    @_translated
    def delete_file(self, file_id: str) -> None:
        record = self.get_file(file_id)
        if record is None:
            return
        with self._r.pipeline(transaction=True) as pipe:
            pipe.delete(self._k("file", file_id), self._k("filedata", file_id))
            pipe.zrem(self._k("tfiles", record.tenant), file_id)
            pipe.execute()
        self._acked()

    # Batches ----------------------------------------------------------------------------------

    def _batch_fields(self, batch: BatchRecord) -> dict[str, str]:
        fields = {k: repr(v) if isinstance(v, float) else str(v) for k, v in
                  batch.dynamic_fields().items() if v is not None}  # fmt: skip
        fields.update(
            static=batch.static_json(),
            tenant=batch.tenant,
            created_at=repr(batch.created_at),
            expires_at=repr(batch.expires_at),
        )
        return fields

    @_translated
    def create_batch(self, batch: BatchRecord, max_open_items: int) -> BatchRecord:
        fields = self._batch_fields(batch)
        fields.pop("seq", None)
        seq, open_items = self._run(
            "CREATE_BATCH",
            batch.id,
            batch.tenant,
            batch.total,
            max_open_items,
            repr(batch.expires_at),
            json.dumps(fields),
        )
        if int(seq) < 0:
            raise QuotaExceededError(batch.tenant, int(open_items), batch.total, max_open_items)
        batch.seq = int(seq)
        self._acked()
        return batch

    def _get_batch(self, batch_id: str) -> BatchRecord | None:
        raw = cast(dict[bytes, bytes], self._r.hgetall(self._k("batch", batch_id)))
        if not raw:
            return None
        fields = {_text(k): _text(v) for k, v in raw.items()}
        return BatchRecord.from_fields(fields["static"], fields)

    @_translated
    def get_batch(self, batch_id: str) -> BatchRecord | None:
        return self._get_batch(batch_id)

    @_translated
    def list_batches(self, tenant: str, after: str | None, limit: int) -> list[BatchRecord]:
        found = (self._get_batch(i) for i in self._page(self._k("tbatches", tenant), after, limit))
        return [b for b in found if b is not None]

    @_translated
    def validating_batches(self) -> list[str]:
        return [_text(i) for i in cast(list[bytes], self._r.zrange(self._k("validating"), 0, -1))]

    def _watched(self, batch_id: str, write: Callable[[Any, BatchRecord], bool]) -> bool:
        """Run `write(pipe, batch)` in MULTI/EXEC, retried if the batch changed meanwhile."""
        key = self._k("batch", batch_id)
        for _ in range(5):
            with self._r.pipeline(transaction=True) as raw_pipe:
                pipe: Any = raw_pipe
                try:
                    pipe.watch(key)
                    batch = self._get_batch(batch_id)
                    if batch is None:
                        return False
                    pipe.multi()
                    if not write(pipe, batch):
                        pipe.reset()
                        return False
                    pipe.execute()
                    self._acked()
                    return True
                except redis.WatchError:
                    continue
        raise StoreError(f"batch {batch_id} kept changing; giving up this round")

    @_translated
    def start_batch(
        self, batch_id: str, queue: QueueKey, items: Sequence[NewItem], now: float
    ) -> bool:
        qk = queue.encode()

        def write(pipe: Any, batch: BatchRecord) -> bool:
            if batch.status is not BatchStatus.VALIDATING:
                return False
            if len(items) != batch.total:
                raise StoreError(f"batch {batch_id}: {len(items)} items, expected {batch.total}")
            for start in range(0, len(items), _CHUNK):
                chunk = items[start : start + _CHUNK]
                members = {item_member(batch_id, it.idx): 0.0 for it in chunk}
                pipe.hset(self._k("items", batch_id),
                          mapping={_field(it.idx): it.request_json for it in chunk})  # fmt: skip
                pipe.hset(self._k("state", batch_id), mapping={_field(it.idx): "Q" for it in chunk})
                pipe.zadd(self._k("q", qk), dict.fromkeys(members, batch.expires_at))
                pipe.zadd(self._k("qa", qk), dict.fromkeys(members, batch.created_at))
            pipe.zadd(self._k("qb", qk), {batch_id: batch.created_at})
            pipe.hset(
                self._k("batch", batch_id),
                mapping={
                    "status": BatchStatus.IN_PROGRESS.value,
                    "in_progress_at": repr(now),
                    "model": queue.model,
                    "region": queue.region,
                    "queue": qk,
                },
            )
            pipe.sadd(self._k("queues"), qk)
            pipe.zrem(self._k("validating"), batch_id)
            return True

        return self._watched(batch_id, write)

    @_translated
    def fail_batch(
        self,
        batch_id: str,
        errors: Sequence[LineError],
        error_file: FileRecord | None,
        error_content: bytes,
        now: float,
    ) -> bool:
        def write(pipe: Any, batch: BatchRecord) -> bool:
            if batch.status is not BatchStatus.VALIDATING:
                return False
            fields = {
                "status": BatchStatus.FAILED.value,
                "failed_at": repr(now),
                "errors": json.dumps([e.to_dict() for e in errors]),
            }
            if error_file is not None:
                self._queue_file(pipe, error_file, error_content)
                fields["error_file_id"] = error_file.id
            pipe.hset(self._k("batch", batch_id), mapping=fields)
            pipe.zrem(self._k("validating"), batch_id)
            pipe.zrem(self._k("active"), batch_id)
            pipe.decrby(self._k("open", batch.tenant), batch.total)
            return True

        return self._watched(batch_id, write)

    @_translated
    def cancel_batch(self, batch_id: str, now: float) -> BatchRecord:
        outcome = _text(self._run("CANCEL", batch_id, repr(now)))
        if outcome == "missing":
            raise NotFoundError(batch_id)
        if outcome != "ok":
            status, _, pending = outcome.partition(" ")
            raise InvalidTransitionError(
                batch_id, BatchStatus(status), "cancel", BatchStatus(pending) if pending else None
            )
        self._acked()
        batch = self._get_batch(batch_id)
        assert batch is not None
        return batch

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
        cut = resolve_promotion(promoted, promotion) or Promotion(0.0, 0.0)
        token = new_lease_token()
        times = (lease_until, cut.now, cut.promote_after_s, cut.reference_window_s)
        args = (queue.encode(), by_deadline, promoted, limit, token, *map(repr, times))
        rows = self._run("CLAIM", *args)
        claimed = []
        for member, attempts, request_json, tenant, created_at, expires_at in rows:
            batch_id, idx = split_member(_text(member))
            request = json.loads(request_json)
            claimed.append(
                ClaimedItem(
                    batch_id=batch_id,
                    idx=idx,
                    custom_id=request["custom_id"],
                    url=request["url"],
                    body=request["body"],
                    tenant=_text(tenant),
                    created_at=float(created_at),
                    deadline=float(expires_at),
                    attempts=int(attempts),
                    token=token,
                    queue=queue,
                )
            )
        self._acked()
        return claimed

    @_translated
    def settle(self, settlements: Sequence[Settlement], now: float) -> list[bool]:
        if not settlements:
            return []
        args: list[Any] = [repr(now)]
        for s in settlements:
            item = s.item
            if s.result is None:
                kind, payload, t_in, t_out = "i" if s.refund else "r", repr(s.retry_at), 0, 0
            else:
                stored = encode_result(s.result.ok, s.result.line)
                kind, payload = stored[0], stored[1:]
                t_in, t_out = s.result.input_tokens, s.result.output_tokens
            args += [item.member, item.token, kind, payload, t_in, t_out, item.queue.encode()]
        applied = self._run("SETTLE", *args)
        self._acked()
        return [bool(int(a)) for a in applied]

    @_translated
    def requeue(self, item: ClaimedItem, refund: bool, now: float) -> bool:
        args = (repr(now), item.member, item.token, int(refund), item.queue.encode())
        requeued = bool(int(self._run("REQUEUE", *args)))
        self._acked()
        return requeued

    def _queues(self) -> list[str]:
        return sorted(_text(q) for q in cast(set[bytes], self._r.smembers(self._k("queues"))))

    @_translated
    def recover_leases(self, now: float, everything: bool = False) -> int:
        cutoff = "+inf" if everything else repr(now)
        handled = 0
        for qk in self._queues():
            while True:
                n = int(self._run("RECOVER", qk, cutoff, 1000, repr(now)))
                handled += n
                if n < 1000:
                    break
        if handled:
            self._acked()
        return handled

    @_translated
    def expire_batches(self, now: float) -> list[str]:
        due = cast(list[bytes], self._r.zrangebyscore(self._k("active"), "-inf", repr(now)))
        expired = [_text(b) for b in due if int(self._run("EXPIRE", _text(b), repr(now)))]
        if expired:
            self._acked()
        return expired

    @_translated
    def finalize_batches(self, now: float) -> list[str]:
        done: list[str] = []
        for raw in sorted(cast(set[bytes], self._r.smembers(self._k("finalize")))):
            batch_id = _text(raw)
            self._watched(batch_id, lambda pipe, batch: self._finalize(pipe, batch, now, done))
        return done

    def _finalize(self, pipe: Any, batch: BatchRecord, now: float, done: list[str]) -> bool:
        """Queue the writes that publish `batch` (inside MULTI; reads use the plain client)."""
        if batch.pending_final is None:
            pipe.srem(self._k("finalize"), batch.id)
            return True
        if batch.open_items > 0:
            return False
        results = cast(dict[bytes, bytes], self._r.hgetall(self._k("res", batch.id)))
        # Only markers (expired, cancelled) need the request for its custom_id; engine results
        # carry it in their line already.
        markers = [k for k, v in results.items() if len(v) == 1]
        custom_ids: dict[bytes, str] = {}
        for start in range(0, len(markers), _CHUNK):
            chunk = markers[start : start + _CHUNK]
            found = cast(list[bytes], self._r.hmget(self._k("items", batch.id), chunk))
            custom_ids.update(
                (k, json.loads(raw)["custom_id"]) for k, raw in zip(chunk, found, strict=True)
            )
        rows = ((int(k), custom_ids.get(k, ""), _text(v)) for k, v in results.items())
        files = assemble(batch, rows, now)
        fields = {"status": batch.pending_final.value, "pending_final": ""}
        stamp = f"{batch.pending_final.value}_at"
        if getattr(batch, stamp) is None:
            fields[stamp] = repr(now)
        for record, content, name in (
            (files.output, files.output_content, "output_file_id"),
            (files.error, files.error_content, "error_file_id"),
        ):
            if record is not None:
                self._queue_file(pipe, record, content)
                fields[name] = record.id
        pipe.hset(self._k("batch", batch.id), mapping=fields)
        for part in ("items", "state", "att", "res"):
            pipe.unlink(self._k(part, batch.id))
        pipe.srem(self._k("finalize"), batch.id)
        done.append(batch.id)
        return True

    @_translated
    def backlog(self, now: float, due_within_s: Sequence[float]) -> dict[QueueKey, QueueBacklog]:
        queues = self._queues()
        with self._r.pipeline(transaction=False) as pipe:
            for qk in queues:
                pipe.zcard(self._k("q", qk))
                pipe.zcard(self._k("lease", qk))
                pipe.zrange(self._k("qa", qk), 0, 0, withscores=True)
                for s in due_within_s:
                    pipe.zcount(self._k("q", qk), "-inf", repr(now + s))
            replies = pipe.execute()
        found: dict[QueueKey, QueueBacklog] = {}
        width = 3 + len(due_within_s)
        for n, qk in enumerate(queues):
            queued, leased, oldest, *due = replies[n * width : (n + 1) * width]
            if not queued and not leased:
                continue
            found[QueueKey.decode(qk)] = QueueBacklog(
                int(queued),
                int(leased),
                float(oldest[0][1]) if oldest else None,
                tuple(zip(due_within_s, (int(d) for d in due), strict=True)),
            )
        return found
