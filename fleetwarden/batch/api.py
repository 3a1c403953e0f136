"""The OpenAI-compatible Files and Batches API on aiohttp.

Every `/v1/` route needs `Authorization: Bearer <token>`; the token names the tenant, and a
tenant sees only its own files and batches (others' ids answer 404, not 403, so ids cannot be
probed). `/metrics`, `/healthz` and `/readyz` are open for Prometheus and kubelet probes.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeGuard

from aiohttp import web

from fleetwarden.batch.clock import Clock
from fleetwarden.batch.config import BatchServiceConfig
from fleetwarden.batch.content_coding import ACCEPT_ENCODING
from fleetwarden.batch.errors import ApiError, error_body
from fleetwarden.batch.ids import new_batch_id, new_file_id
from fleetwarden.batch.maintenance import REGION_METADATA_KEY, Maintenance
from fleetwarden.batch.metrics import BatchMetrics
from fleetwarden.batch.records import (
    ENDPOINTS,
    FINAL_STATUSES,
    BatchRecord,
    BatchStatus,
    FileKind,
    FileRecord,
)
from fleetwarden.batch.runner import StoreRunner
from fleetwarden.batch.shapes import batch_object, file_object, list_object
from fleetwarden.batch.store.base import (
    InvalidTransitionError,
    NotFoundError,
    QuotaExceededError,
    StoreError,
)
from fleetwarden.batch.uploads import OFF_LOOP_BYTES, read_json, read_upload
from fleetwarden.batch.validation import WindowError, count_lines, parse_completion_window

log = logging.getLogger(__name__)

TENANT: web.RequestKey[str] = web.RequestKey("tenant", str)
_BEARER = re.compile(r"^Bearer\s+(\S+)\s*$", re.IGNORECASE)
_MAX_JSON_BYTES = 64 * 1024
_METADATA_KEYS, _METADATA_KEY_CHARS, _METADATA_VALUE_CHARS = 16, 64, 512
_REQUEST_READERS = frozenset(
    {"aiohttp.web_request", "aiohttp.multipart", "aiohttp.streams", "aiohttp.http_parser"}
)
"""aiohttp modules that read the client's request: a ValueError raised inside them is the
client's malformed input (see `_from_reading_the_request`)."""


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BatchApi:
    """The handlers, bound to one service's store, config and clock."""

    def __init__(
        self,
        runner: StoreRunner,
        config: BatchServiceConfig,
        clock: Clock,
        maintenance: Maintenance,
        metrics: BatchMetrics,
    ) -> None:
        self._runner = runner
        self._store = runner.store
        self._config = config
        self._clock = clock
        self._maintenance = maintenance
        self._metrics = metrics
        self._tenants = config.auth.digests()
        self._regions = {t.region for t in config.targets}
        self.ready = False

    def app(self) -> web.Application:
        # auto_decompress off: uploads.py decodes Content-Encoding itself (content_coding.py)
        app = web.Application(middlewares=[self._middleware], client_max_size=_MAX_JSON_BYTES,
                              handler_args={"auto_decompress": False})  # fmt: skip
        app.router.add_post("/v1/files", self.create_file)
        app.router.add_get("/v1/files", self.list_files)
        app.router.add_get("/v1/files/{file_id}", self.get_file)
        app.router.add_delete("/v1/files/{file_id}", self.delete_file)
        app.router.add_get("/v1/files/{file_id}/content", self.file_content)
        app.router.add_post("/v1/batches", self.create_batch)
        app.router.add_get("/v1/batches", self.list_batches)
        app.router.add_get("/v1/batches/{batch_id}", self.get_batch)
        app.router.add_post("/v1/batches/{batch_id}/cancel", self.cancel_batch)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if request.path.startswith("/v1/"):
                request[TENANT] = self._authenticate(request)
            return await handler(request)
        except ApiError as exc:
            # RFC 9110 section 15.5.16: a 415 for a content coding names the accepted ones
            headers = {"Accept-Encoding": ACCEPT_ENCODING} if exc.status == 415 else None
            return web.json_response(exc.body(), status=exc.status, headers=headers)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return web.json_response(error_body(exc.status, exc.reason), status=exc.status)
        except StoreError as exc:
            log.warning("store error on %s %s: %s", request.method, request.path, exc)
            body = error_body(503, "the batch store is unavailable; retry", "store_unavailable")
            return web.json_response(body, status=503)
        except Exception as exc:
            if isinstance(exc, ValueError) and _from_reading_the_request(exc.__traceback__):
                # UnicodeError included: input a handler did not check, e.g. a malformed body
                body = error_body(400, f"malformed request: {exc}", "invalid_request")
                return web.json_response(body, status=400)
            # A bug, not the client's fault: 500, in OpenAI's shape so clients raise their typed
            # InternalServerError rather than fail to parse aiohttp's text page.
            log.exception("error on %s %s", request.method, request.path)
            return web.json_response(error_body(500, "internal error"), status=500)

    def _authenticate(self, request: web.Request) -> str:
        match = _BEARER.match(request.headers.get("Authorization", ""))
        if match is None:
            raise ApiError(401, "missing bearer token in the Authorization header",
                           "invalid_api_key")  # fmt: skip
        # aiohttp decodes header bytes as UTF-8 with surrogateescape; this gives back the bytes
        # the client sent (a token that is not UTF-8 is then just a wrong token).
        token = match.group(1).encode("utf-8", "surrogateescape")
        tenant = self._tenants.get(hashlib.sha256(token).hexdigest())
        if tenant is None:
            raise ApiError(401, "incorrect API key provided", "invalid_api_key")
        return tenant

    # Files ------------------------------------------------------------------------------------

    async def create_file(self, request: web.Request) -> web.Response:
        tenant = request[TENANT]
        limit = self._config.quota(tenant).max_file_bytes
        purpose, content, filename = await read_upload(request, limit)
        if purpose != "batch":
            raise ApiError(400, f"purpose must be 'batch', got {purpose!r}", "invalid_purpose",
                           "purpose")  # fmt: skip
        if content is None:
            raise ApiError(400, "the request has no file part", "missing_file", "file")
        # off the loop when large: even bytes.count takes ~40 ms per 100 MB, every tenant waits
        big = len(content) > OFF_LOOP_BYTES
        lines = await asyncio.to_thread(count_lines, content) if big else count_lines(content)
        record = FileRecord(new_file_id(), tenant, filename[:255], "batch", len(content),
                            self._clock.now(), lines)  # fmt: skip
        await self._runner.call(self._store.put_file, record, content)
        return web.json_response(file_object(record))

    async def _file(self, request: web.Request) -> FileRecord:
        record = await self._runner.call(self._store.get_file, request.match_info["file_id"])
        if record is None or record.tenant != request[TENANT]:
            raise ApiError(404, f"no such file: {request.match_info['file_id']}", "not_found")
        return record

    async def get_file(self, request: web.Request) -> web.Response:
        return web.json_response(file_object(await self._file(request)))

    async def list_files(self, request: web.Request) -> web.Response:
        after, limit = self._page(request)
        rows = await self._runner.call(self._store.list_files, request[TENANT], after, limit + 1)
        return web.json_response(list_object(rows, limit, file_object))

    async def file_content(self, request: web.Request) -> web.Response:
        record = await self._file(request)
        content = await self._runner.call(self._store.file_content, record.id)
        if content is None:
            raise ApiError(404, f"no content for file {record.id}", "not_found")
        return web.Response(body=content, content_type="application/jsonl")

    async def delete_file(self, request: web.Request) -> web.Response:
        record = await self._file(request)
        if record.kind is FileKind.UPLOAD:
            for batch_id in await self._runner.call(self._store.validating_batches):
                batch = await self._runner.call(self._store.get_batch, batch_id)
                if batch is not None and batch.input_file_id == record.id:
                    raise ApiError(409, f"batch {batch_id} is still reading this file",
                                   "file_in_use")  # fmt: skip
        await self._runner.call(self._store.delete_file, record.id)
        return web.json_response({"id": record.id, "object": "file", "deleted": True})

    # Batches ----------------------------------------------------------------------------------

    async def create_batch(self, request: web.Request) -> web.Response:
        tenant = request[TENANT]
        body = await _json_object(request)
        endpoint = body.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise ApiError(400, f"endpoint must be one of {', '.join(ENDPOINTS)}",
                           "invalid_endpoint", "endpoint")  # fmt: skip
        window = body.get("completion_window", "24h")
        limits = self._config.limits
        try:
            window_s = parse_completion_window(
                str(window), limits.min_completion_window_s, limits.max_completion_window_s
            )
        except WindowError as exc:
            raise ApiError(400, str(exc), "invalid_completion_window", "completion_window") from exc
        metadata = _metadata(body.get("metadata"))
        region = metadata.get(REGION_METADATA_KEY)
        if region is not None and region not in self._regions:
            raise ApiError(400, f"no target serves region {region!r}", "region_not_served",
                           f"metadata.{REGION_METADATA_KEY}")  # fmt: skip
        file_id = body.get("input_file_id")
        record = await self._runner.call(self._store.get_file, file_id) if _is_id(file_id) else None
        if record is None or record.tenant != tenant:
            raise ApiError(404, f"no such file: {file_id}", "not_found", "input_file_id")
        if record.kind is not FileKind.UPLOAD or record.purpose != "batch":
            raise ApiError(400, f"file {file_id} was not uploaded with purpose 'batch'",
                           "invalid_input_file", "input_file_id")  # fmt: skip
        now = self._clock.now()
        batch = BatchRecord(new_batch_id(), tenant, str(endpoint), record.id, str(window), now,
                            now + window_s, total=record.lines, metadata=metadata)  # fmt: skip
        try:
            batch = await self._runner.call(
                self._store.create_batch, batch, self._config.quota(tenant).max_queued_items
            )
        except QuotaExceededError as exc:
            raise ApiError(429, str(exc), "max_queued_items_exceeded") from exc
        self._maintenance.wake()
        return web.json_response(batch_object(batch))

    async def _batch(self, request: web.Request) -> BatchRecord:
        batch_id = request.match_info["batch_id"]
        batch = await self._runner.call(self._store.get_batch, batch_id)
        if batch is None or batch.tenant != request[TENANT]:
            raise ApiError(404, f"no such batch: {batch_id}", "not_found")
        return batch

    async def get_batch(self, request: web.Request) -> web.Response:
        return web.json_response(batch_object(await self._batch(request)))

    async def list_batches(self, request: web.Request) -> web.Response:
        after, limit = self._page(request)
        rows = await self._runner.call(self._store.list_batches, request[TENANT], after, limit + 1)
        return web.json_response(list_object(rows, limit, batch_object))

    async def cancel_batch(self, request: web.Request) -> web.Response:
        batch = await self._batch(request)
        if batch.status in FINAL_STATUSES - {BatchStatus.CANCELLED}:
            raise ApiError(409, f"batch {batch.id} is {batch.status.value}; cannot cancel",
                           "invalid_status")  # fmt: skip
        try:
            batch = await self._runner.call(self._store.cancel_batch, batch.id, self._clock.now())
        except NotFoundError as exc:
            raise ApiError(404, f"no such batch: {batch.id}", "not_found") from exc
        except InvalidTransitionError as exc:
            raise ApiError(409, str(exc), "invalid_status") from exc
        self._maintenance.wake()
        return web.json_response(batch_object(batch))

    def _page(self, request: web.Request) -> tuple[str | None, int]:
        most = self._config.limits.max_list_limit
        raw = request.query.get("limit")
        try:
            limit = int(raw) if raw is not None else min(20, most)
        except ValueError as exc:
            raise ApiError(400, "limit must be an integer", "invalid_limit", "limit") from exc
        if not 1 <= limit <= most:
            raise ApiError(400, f"limit must be between 1 and {most}", "invalid_limit", "limit")
        return request.query.get("after") or None, limit

    # Operations -------------------------------------------------------------------------------

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self._metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4"})  # fmt: skip

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        """Ready once startup recovery ran and the store answers."""
        if not self.ready:
            return web.json_response({"status": "starting"}, status=503)
        await self._runner.call(self._store.get_batch, "batch_readiness_probe")
        return web.json_response({"status": "ready"})


def _is_id(value: object) -> TypeGuard[str]:
    """Whether `value` from a JSON body can be a file id at all: a non-empty string the stores
    can encode. Anything else (a number, a lone surrogate escape such as "\\ud800") names no
    file, and must not reach a store, which would fail on it (URLs cannot carry one: aiohttp
    refuses non-ASCII bytes there)."""
    if not isinstance(value, str) or not value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _from_reading_the_request(tb: TracebackType | None) -> bool:
    """Whether an exception came from aiohttp reading the request (malformed client input)
    rather than from the service's own code or the stores (a bug: 500, not 400)."""
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__") in _REQUEST_READERS:
            return True
        tb = tb.tb_next
    return False


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        body = await read_json(request, _MAX_JSON_BYTES)
    except ValueError as exc:
        raise ApiError(400, f"the body is not JSON: {exc}", "invalid_json") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", "invalid_json")
    return body


def _metadata(raw: object) -> dict[str, str]:
    """OpenAI's metadata rules: at most 16 string pairs, keys <= 64 and values <= 512 chars."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or len(raw) > _METADATA_KEYS:
        raise ApiError(400, f"metadata must be an object of at most {_METADATA_KEYS} pairs",
                       "invalid_metadata", "metadata")  # fmt: skip
    for key, value in raw.items():
        if (
            not isinstance(key, str)
            or not isinstance(value, str)
            or len(key) > _METADATA_KEY_CHARS
            or len(value) > _METADATA_VALUE_CHARS
        ):
            raise ApiError(400, "metadata keys must be strings of at most 64 characters and "
                           "values strings of at most 512", "invalid_metadata",
                           "metadata")  # fmt: skip
    return dict(raw)
