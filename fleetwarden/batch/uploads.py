"""Reading request bodies: the multipart upload of `POST /v1/files` and JSON bodies, each with
its Content-Encoding (whole request, or a form part) decoded as it streams in.

Limits count decoded bytes, checked after every piece of at most `content_coding.PIECE` bytes, so
a decompression bomb is refused with a 413 as soon as it passes the limit. The compressed bytes
are bounded too (`wire_limit`): a deflate stream of empty blocks decodes to nothing, and without
that bound a client could keep one request open forever. An identity upload is counted the same
way: sent chunked it has no Content-Length, and its fields and framing would otherwise be read
without end. A form holds one `file`, one `purpose` and at most `MAX_FIELDS` fields in all: a
repeated part would silently replace the first.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

from aiohttp import BodyPartReader, MultipartReader, StreamReader, hdrs, web
from multidict import CIMultiDictProxy

from fleetwarden.batch.content_coding import (
    ContentCodingError,
    StreamDecoder,
    UnsupportedCodingError,
    content_coding,
)
from fleetwarden.batch.errors import ApiError

_CHUNK = 256 * 1024
_MAX_FIELD_BYTES = 1024
"""Multipart fields other than the file (purpose) are tiny; anything bigger is refused."""
MAX_FIELDS = 8
"""Most parts other than the file in one upload form: `purpose`, and room for the few fields
other clients add (OpenAI's `expires_after[...]`); together far inside `_FORM_SLACK`."""
_SINGLE_PARTS = ("file", "purpose")
"""Parts a form may hold once: a second one is refused rather than silently replacing the first."""
_FORM_SLACK = 64 * 1024
"""Room for the multipart framing and fields around a file of the tenant's limit."""
_WIRE_SLACK = 64 * 1024
"""Room for a coding's headers and trailers, and for small bodies, in `wire_limit`."""
OFF_LOOP_BYTES = 1 << 20
"""Contents larger than this are joined (and counted, `api.create_file`) on a worker thread:
on the event loop, 100 MB would stall every tenant's requests for a tenth of a second."""


def wire_limit(limit: int) -> int:
    """The most compressed bytes accepted for at most `limit` decoded bytes: deflate grows
    incompressible data by far less than 0.1 %."""
    return limit + limit // 1024 + _WIRE_SLACK


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"the file exceeds this tenant's limit of {limit} bytes",
                    "file_too_large", "file")  # fmt: skip


def coding_of(headers: CIMultiDictProxy[str], where: str, param: str | None = None) -> str | None:
    """The decoded coding of a request or part (None: identity); 415 for any other."""
    try:
        return content_coding(headers.getall(hdrs.CONTENT_ENCODING, ()))
    except UnsupportedCodingError as exc:
        raise ApiError(415, f"{where}: {exc}", "unsupported_content_encoding", param) from exc


def _corrupt(where: str, coding: str, exc: ContentCodingError, param: str | None) -> ApiError:
    return ApiError(400, f"{where} does not decode as its Content-Encoding {coding}: {exc}",
                    "invalid_content_encoding", param)  # fmt: skip


class DecodedBody:
    """A request body decoded from its Content-Encoding (None: identity, taken as sent), with
    the reading methods aiohttp's MultipartReader and BodyPartReader call on a StreamReader
    (read, readline, at_eof, unread_data). Pieces are decoded only as the reader asks, so memory
    stays at about one compressed chunk plus one decoded piece plus the reader's look-ahead.
    Every byte read from the request counts, the preamble, part headers and boundaries
    included: an identity body is refused as soon as it passes `limit`, whatever its framing."""

    def __init__(self, raw: StreamReader, coding: str | None, limit: int, error: ApiError) -> None:
        self._raw = raw
        self._decoder = None if coding is None else StreamDecoder(coding)
        self._limit, self._error = limit, error
        self._wire_limit = limit if coding is None else wire_limit(limit)
        self._decoded = self._wire = 0
        self._buffer = bytearray()
        self._eof = False

    async def _fill(self) -> None:
        """Append the next decoded piece to the buffer, or reach the end of the body."""
        decoder = self._decoder
        if decoder is None:
            await self._fill_identity()
            return
        try:
            while not self._eof:
                if piece := decoder.decode_piece():
                    self._decoded += len(piece)
                    if self._decoded > self._limit:
                        raise self._error
                    self._buffer += piece
                    await asyncio.sleep(0)  # inflating never holds the event loop for long
                    return
                chunk = await self._raw.read(_CHUNK)
                if not chunk:
                    decoder.finish()
                    self._eof = True
                    return
                self._wire += len(chunk)
                if self._wire > self._wire_limit:
                    raise self._error
                decoder.feed(chunk)
        except ContentCodingError as exc:
            raise _corrupt("the request body", decoder.coding, exc, None) from exc

    async def _fill_identity(self) -> None:
        """Append the next chunk as sent, or reach the end of the body."""
        if self._eof:
            return
        chunk = await self._raw.read(_CHUNK)
        if not chunk:
            self._eof = True
            return
        self._wire += len(chunk)
        if self._wire > self._wire_limit:
            raise self._error
        self._buffer += chunk

    def _take(self, n: int) -> bytes:
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    async def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes (all of the rest for a negative `n`); b"" only at the end."""
        if n < 0:
            while not self._eof:
                await self._fill()
            return self._take(len(self._buffer))
        while n and not self._buffer and not self._eof:
            await self._fill()
        return self._take(n)

    async def readline(self, *, max_line_length: int | None = None) -> bytes:
        """The next line with its b"\\n" (the rest at the end); ValueError past the length.
        Without one (boundary and preamble lines) the body's own limit bounds it, as long
        lines are accepted in an identity body too."""
        most = max_line_length or self._limit
        searched = 0  # each byte is searched once: a long line costs linear time
        while (end := self._buffer.find(b"\n", searched)) < 0 and not self._eof:
            if len(self._buffer) > most:
                break
            searched = len(self._buffer)
            await self._fill()
        size = end + 1 if end >= 0 else len(self._buffer)
        if size > most:
            raise ValueError(f"a line of the request body is longer than {most} bytes")
        return self._take(size)

    def at_eof(self) -> bool:
        return self._eof and not self._buffer

    def unread_data(self, data: bytes) -> None:
        self._buffer[:0] = data

    async def drain(self) -> None:
        """Read to the end, past the closing boundary, so a truncated stream or a wrong gzip
        checksum (in the last bytes) refuses the upload instead of passing unseen."""
        while not self._eof:
            self._buffer.clear()
            await self._fill()


async def read_upload(request: web.Request, limit: int) -> tuple[str | None, bytes | None, str]:
    """The `purpose`, file content and filename of a `POST /v1/files` form, each part and the
    whole request decoded from its Content-Encoding; ApiError for anything refused. Every byte
    read counts against `limit` + `_FORM_SLACK`, compressed or not, Content-Length or not."""
    coding = coding_of(request.headers, "the request body")
    most = limit + _FORM_SLACK if coding is None else wire_limit(limit + _FORM_SLACK)
    if request.content_length is not None and request.content_length > most:
        raise too_large(limit)
    body = DecodedBody(request.content, coding, limit + _FORM_SLACK, too_large(limit))
    try:
        # DecodedBody has every method the readers call on their StreamReader
        reader = MultipartReader(request.headers, cast(StreamReader, body))
    except (AssertionError, ValueError, KeyError) as exc:  # not multipart/form-data
        raise ApiError(400, f"expected multipart/form-data: {exc}", "invalid_request") from exc
    try:
        form = await _read_form(reader, limit)
        if coding is not None:
            await body.drain()
    except ValueError as exc:  # a body that breaks its own framing: wrong boundary, cut off
        raise ApiError(400, f"malformed multipart/form-data body: {exc}",
                       "invalid_request") from exc  # fmt: skip
    return form


async def _read_form(reader: MultipartReader, limit: int) -> tuple[str | None, bytes | None, str]:
    """The upload's `purpose`, file content and filename; ValueError for a malformed body,
    ApiError for a form with a repeated `file` or `purpose` or more than `MAX_FIELDS` fields."""
    purpose: str | None = None
    content: bytes | None = None
    filename = "input.jsonl"
    seen: list[str | None] = []
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise ApiError(400, "nested multipart is not supported", "invalid_request")
        if part.name in _SINGLE_PARTS and part.name in seen:
            raise ApiError(400, f"the form has more than one {part.name!r} part; send one",
                           "invalid_request", part.name)  # fmt: skip
        seen.append(part.name)
        if len(seen) - seen.count("file") > MAX_FIELDS:
            raise ApiError(400, f"the form has more than {MAX_FIELDS} fields besides the file; "
                           "send purpose and file", "invalid_request")  # fmt: skip
        if part.name == "file":
            filename = part.filename or filename
            content = await _read_part(part, limit, too_large(limit))
        else:
            too_long = ApiError(400, f"field {part.name} is too long", "invalid_request")
            value = await _read_part(part, _MAX_FIELD_BYTES, too_long)
            if part.name == "purpose":
                purpose = value.decode("utf-8", "replace").strip()
    return purpose, content, filename


async def _read_part(part: BodyPartReader, limit: int, error: ApiError) -> bytes:
    """A part's decoded bytes, refusing as soon as they exceed `limit`. aiohttp undoes only
    the part's Content-Transfer-Encoding (base64) here: form-data parts' Content-Encoding is
    ours to decode (RFC 7578 section 4.8 says to ignore it, which stored gzip bytes as the
    file)."""
    param = "file" if part.name == "file" else part.name
    where = f"part {part.name!r}"
    coding = coding_of(part.headers, where, param)
    if coding is not None:
        try:
            return await _read_encoded_part(part, StreamDecoder(coding), limit, error)
        except ContentCodingError as exc:
            raise _corrupt(where, coding, exc, param) from exc
    chunks: list[bytes] = []
    size = 0
    while chunk := await part.read_chunk(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise error
        chunks.append(part.decode(chunk))
    return await _joined(chunks, size)


async def _read_encoded_part(
    part: BodyPartReader, decoder: StreamDecoder, limit: int, error: ApiError
) -> bytes:
    """A gzip or deflate part's decoded bytes: `limit` bounds the decoded bytes, checked after
    every piece, and `wire_limit` the compressed ones."""
    chunks: list[bytes] = []
    size = wire = 0
    while chunk := await part.read_chunk(_CHUNK):
        compressed = bytes(part.decode(chunk))  # base64 undone: the coding's own bytes
        wire += len(compressed)
        if wire > wire_limit(limit):
            raise error
        decoder.feed(compressed)
        while piece := decoder.decode_piece():
            size += len(piece)
            if size > limit:
                raise error
            chunks.append(piece)
            await asyncio.sleep(0)  # inflating never holds the event loop for long
    decoder.finish()
    return await _joined(chunks, size)


async def _joined(chunks: list[bytes], size: int) -> bytes:
    """The chunks as one bytes object; a large one is joined on a worker thread, where
    bytes.join copies without holding the GIL."""
    if size > OFF_LOOP_BYTES:
        return await asyncio.to_thread(_join, chunks)
    return _join(chunks)


def _join(chunks: list[bytes]) -> bytes:
    return b"".join(chunks)


async def read_json(request: web.Request, limit: int) -> Any:
    """A JSON body decoded from its Content-Encoding; ValueError for text that is not JSON.
    An identity body is aiohttp's `request.json()` (its `client_max_size` bounds it)."""
    coding = coding_of(request.headers, "the request body")
    if coding is None:
        return await request.json()
    error = ApiError(413, f"the request body exceeds {limit} bytes once decoded",
                     "request_too_large")  # fmt: skip
    raw = await DecodedBody(request.content, coding, limit, error).read()
    return json.loads(raw.decode(request.charset or "utf-8"))
