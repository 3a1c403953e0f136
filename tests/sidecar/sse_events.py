"""Server-sent events as an OpenAI-compatible engine streams them, for the relay's tests."""

from __future__ import annotations

import json

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n\n'
"""The final usage chunk; `% n` fills in the completion tokens."""
DONE = b"data: [DONE]\n\n"
COMMENT = b": keep-alive\n\n"


def token(text: str) -> bytes:
    """One content event carrying `text`."""
    delta = json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]})
    return b"data: " + delta.encode() + b"\n\n"
