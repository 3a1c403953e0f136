"""Lines of the output and error files, in the OpenAI Batch API format (pure).

Output line: `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`.
An engine's error reply keeps the same shape in the error file (its status code and body tell the
client what went wrong); failures without a reply (engine unreachable, batch expired or cancelled)
have `"response": null` and an `error` with a code.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

EXPIRED_MARKER = "x"
CANCELLED_MARKER = "c"
"""Items settled by the batch rather than by an engine are stored as one-letter markers (the Redis
scripts cannot cheaply render JSON with the item's custom_id); `marker_line` renders them when the
error file is written."""

_MARKERS = {
    EXPIRED_MARKER: (
        "batch_expired",
        "This request could not be executed before the completion window expired.",
    ),
    CANCELLED_MARKER: ("batch_cancelled", "The batch was cancelled before this request ran."),
}


def item_id(batch_id: str, idx: int) -> str:
    """The `id` of an item's result line: stable, so a re-rendered line is byte-identical."""
    digest = hashlib.sha256(f"{batch_id}:{idx}".encode()).hexdigest()[:24]
    return f"batch_req_{digest}"


def _dumps(value: Any) -> str:
    """Compact JSON that always encodes as UTF-8, so every store can take the line.

    Text stays readable UTF-8; only a value holding a lone surrogate (an engine reply whose JSON
    escapes half of a UTF-16 pair, e.g. a token cut inside an emoji) is written with every
    non-ASCII character escaped, which keeps the reply exact instead of failing its commit.
    """
    line = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":"))
    return line


def response_line(
    batch_id: str, idx: int, custom_id: str, status: int, request_id: str, body: Any
) -> str:
    """A line for an engine reply (output file on 2xx, error file otherwise)."""
    return _dumps(
        {
            "id": item_id(batch_id, idx),
            "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": body},
            "error": None,
        }
    )


def error_line(batch_id: str, idx: int, custom_id: str, code: str, message: str) -> str:
    """A line for an item that got no usable engine reply."""
    return _dumps(
        {
            "id": item_id(batch_id, idx),
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
    )


def marker_line(marker: str, batch_id: str, idx: int, custom_id: str) -> str:
    """Render a stored marker (expired, cancelled) as its error line."""
    code, message = _MARKERS[marker]
    return error_line(batch_id, idx, custom_id, code, message)


def usage_tokens(body: Any) -> tuple[int, int]:
    """Prompt and completion tokens from an OpenAI reply's `usage`, zeros when absent."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0

    def count(name: str) -> int:
        value = usage.get(name)
        return value if isinstance(value, int) and value >= 0 else 0

    return count("prompt_tokens"), count("completion_tokens")
