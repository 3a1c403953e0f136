"""Read an HTTP body whole, but never more than a bound.

aiohttp's `StreamReader.read(n)` returns what has arrived so far, up to n bytes, not n bytes: a
body that comes in several TCP segments is cut by a single call (the sidecar's admin API refused
large configs as invalid JSON that way). Both ends of the config push read bodies they must
bound, the sidecar a config and the operator an answer; this is their one loop.
"""

from __future__ import annotations

from aiohttp import StreamReader


async def read_capped(stream: StreamReader, declared: int | None, limit: int) -> bytes | None:
    """The whole body, or None once it is known to be longer than `limit` bytes: a declared
    Content-Length over it is refused unread, and otherwise nothing past `limit + 1` is read."""
    if declared is not None and declared > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    while chunk := await stream.read(limit + 1 - size):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return None
    return b"".join(chunks)
