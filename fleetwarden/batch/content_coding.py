"""HTTP content codings of uploaded bodies: gzip and deflate decoded a bounded piece at a time.

The API decodes bodies itself instead of letting aiohttp's parser do it (`auto_decompress`, off in
`BatchApi.app`): aiohttp decodes br and zstd only when optional packages are installed and
answers them otherwise with a text/plain 400 that no handler sees, turns a corrupt gzip body into
an exception a handler cannot tell from a bug, and ignores a form-data part's Content-Encoding
(RFC 7578 section 4.8), so such a file was stored compressed. Here every coding gets the same
answer whatever is installed, and a caller that counts the pieces stops a decompression bomb
after at most one piece past its limit: nothing is ever inflated whole.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

SUPPORTED = ("gzip", "deflate")
"""Codings decoded; `identity` (or no header) means the bytes are the content."""
ACCEPT_ENCODING = ", ".join((*SUPPORTED, "identity"))
"""The Accept-Encoding header a 415 carries (RFC 9110 section 15.5.16)."""
PIECE = 256 * 1024
"""Most decoded bytes one `StreamDecoder.decode_piece` returns."""
_ALIASES = {"x-gzip": "gzip"}  # RFC 9110 section 8.4.1.3
_WINDOW_MIN, _WINDOW_MAX = 64, 64 * 1024
"""Compressed bytes handed to zlib per step: from 64 right after a gzip member starts, doubling
to 64 KiB. A fresh decompressor copies everything past its member into `unused_data`, so
handing it a large window at every boundary is quadratic over a stream of tiny members."""


class ContentCodingError(Exception):
    """A body whose Content-Encoding the service cannot or will not decode."""


class UnsupportedCodingError(ContentCodingError):
    """A coding other than gzip, deflate or identity (br, zstd, compress, unknown tokens), or
    several codings stacked: the bytes are not what the client meant to upload."""


class CorruptStreamError(ContentCodingError):
    """Bytes that do not decode as the declared coding: corrupt, truncated, or followed by
    data that is not part of the stream."""


def content_coding(values: Iterable[str]) -> str | None:
    """The coding that Content-Encoding header values declare: "gzip", "deflate", or None for
    identity (no header, empty, or only `identity` tokens). Tokens are case-insensitive and
    may be comma-separated or repeated headers (RFC 9110 section 8.4)."""
    tokens = [token.strip().lower() for value in values for token in value.split(",")]
    codings = [_ALIASES.get(token, token) for token in tokens if token and token != "identity"]
    if not codings:
        return None
    if len(codings) > 1:
        raise UnsupportedCodingError(
            f"Content-Encoding {', '.join(codings)!r} stacks several codings; "
            f"send one of {ACCEPT_ENCODING}"
        )
    if codings[0] not in SUPPORTED:
        raise UnsupportedCodingError(
            f"Content-Encoding {codings[0]!r} is not supported; send one of {ACCEPT_ENCODING}"
        )
    return codings[0]


class StreamDecoder:
    """Decodes one gzip or deflate body fed in chunks, a piece of at most `PIECE` bytes at a
    time. gzip may have several members (`cat a.gz b.gz`, RFC 1952 section 2.2); deflate is
    RFC 9110's zlib stream, or a raw RFC 1951 stream as some clients send it.

    Feed a chunk only once `decode_piece` has returned b"" (the previous chunk is used up):
    memory then stays at one chunk plus one piece, however far the data would inflate."""

    def __init__(self, coding: str) -> None:
        if coding not in SUPPORTED:
            raise UnsupportedCodingError(f"Content-Encoding {coding!r} is not supported")
        self.coding = coding
        self._inflater: zlib._Decompress | None = None
        self._data = b""
        self._pos = 0
        self._window = _WINDOW_MAX
        self._draining = False  # the last piece filled PIECE: zlib may hold more output

    def feed(self, data: bytes) -> None:
        """Add compressed bytes; the previous ones must be used up."""
        if self._pos < len(self._data) or self._draining:
            raise RuntimeError("feed() before the previous chunk was decoded")
        self._data, self._pos = data, 0

    def decode_piece(self) -> bytes:
        """The next decoded bytes (at most `PIECE`), or b"" once the fed input is used up."""
        while True:
            inflater = self._inflater
            if inflater is not None and inflater.unconsumed_tail:
                data = inflater.unconsumed_tail
            elif inflater is not None and self._draining:
                data = b""
            elif self._pos < len(self._data):
                inflater = self._next_inflater()
                data = self._data[self._pos : self._pos + self._window]
                self._pos += len(data)
                self._window = min(self._window * 2, _WINDOW_MAX)
            else:
                return b""
            try:
                out = inflater.decompress(data, PIECE)
            except zlib.error as exc:
                raise CorruptStreamError(f"not valid {self.coding} data ({exc})") from exc
            self._draining = len(out) == PIECE and not inflater.eof
            if inflater.eof:
                # bytes past this member's end go back to the input: the next member's, or junk
                self._pos -= len(inflater.unused_data)
            if out:
                return out

    def finish(self) -> None:
        """Check that the input fed so far, all used up, ended a complete stream."""
        if self._inflater is None or not self._inflater.eof:
            raise CorruptStreamError(f"the {self.coding} stream is empty or ends early")

    def _next_inflater(self) -> zlib._Decompress:
        """The decompressor for the next input: the current one, or a new one at the start of
        the body or (gzip) of its next member."""
        if self._inflater is not None and not self._inflater.eof:
            return self._inflater
        if self._inflater is not None and self.coding == "deflate":
            raise CorruptStreamError("data follows the end of the deflate stream")
        if self.coding == "gzip":
            self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif self._data[self._pos] & 0x0F == 8:  # RFC 1950 CM: a zlib header
            self._inflater = zlib.decompressobj(zlib.MAX_WBITS)
        else:
            self._inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        self._window = _WINDOW_MIN
        return self._inflater
