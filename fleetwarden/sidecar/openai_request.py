"""Read an OpenAI completion or chat-completion body: validate what scheduling depends on,
estimate its prompt size, and build the body the engine receives.

Only the fields the sidecar needs are checked (model, prompt or messages, max_tokens, stream and
its options, user); everything else passes through untouched for the engine to judge. The prompt
is not tokenized here (that would cost more than the rest of the proxy): it is estimated at four
characters a token plus a few tokens of chat framing per message, charged at dispatch, and
reconciled with the engine's exact `usage` when the response ends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fleetwarden.sidecar.errors import ApiError

CHARS_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4
MAX_TOKENS_LIMIT = 1_000_000
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))
"""`json.dumps(..., separators=...)` builds an encoder per call; the body is encoded per request."""


class CallKind(StrEnum):
    CHAT = "chat"
    COMPLETION = "completion"


@dataclass(frozen=True, slots=True)
class ParsedCall:
    kind: CallKind
    model: str
    stream: bool
    client_wants_usage: bool
    """The client itself asked for `stream_options.include_usage` (else its usage chunk is
    stripped from the relayed stream)."""
    max_tokens: int
    prompt_tokens: int
    """Estimated prompt tokens, system prompt included."""
    system_tokens: int
    user: object
    upstream_body: bytes


def estimate_tokens(text: str) -> int:
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def _content_text(content: object, index: int) -> str:
    """The text of a message's content: a string, or the text parts of a content array."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if not isinstance(part, dict):
                raise ApiError(
                    400, "each content part must be an object", param=f"messages[{index}].content"
                )
            text = part.get("text")
            if isinstance(text, str):
                parts.append(text)
        return "".join(parts)
    raise ApiError(
        400, "content must be a string or an array of parts", param=f"messages[{index}].content"
    )


def _chat_prompt(body: dict[str, Any]) -> tuple[int, int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty array", param="messages")
    total = system = 0
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(
                400,
                "each message must be an object with a string 'role'",
                param=f"messages[{index}]",
            )
        tokens = estimate_tokens(_content_text(message.get("content"), index))
        tokens += CHAT_TOKENS_PER_MESSAGE
        total += tokens
        if message["role"] in ("system", "developer"):
            system += tokens
    return total, system


def _completion_prompt(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return max(1, estimate_tokens(prompt))
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return sum(max(1, estimate_tokens(p)) for p in prompt)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return len(prompt)  # already token ids
    raise ApiError(
        400,
        "'prompt' must be a string, an array of strings or an array of token ids",
        param="prompt",
    )


def _max_tokens(body: dict[str, Any], default: int) -> int:
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiError(400, f"'{field}' must be an integer", param=field)
        if not 1 <= value <= MAX_TOKENS_LIMIT:
            raise ApiError(400, f"'{field}' must be between 1 and {MAX_TOKENS_LIMIT}", param=field)
        return value
    return default


def _too_deep() -> ApiError:
    return ApiError(400, "the request body's JSON is nested too deeply", code="invalid_json")


def parse_call(
    raw: bytes, kind: CallKind, *, default_max_tokens: int, forward_priority: bool
) -> ParsedCall:
    """Validate `raw` and build the upstream body; raises ApiError(400) with the bad field."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
    except RecursionError:  # the C parser gives up near the interpreter's recursion limit
        raise _too_deep() from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' must be a non-empty string", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", param="stream_options")
    client_wants_usage = bool(options and options.get("include_usage") is True)
    if kind is CallKind.CHAT:
        prompt_tokens, system_tokens = _chat_prompt(body)
    else:
        prompt_tokens, system_tokens = _completion_prompt(body), 0
    max_tokens = _max_tokens(body, default_max_tokens)
    n = body.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 128:
        raise ApiError(400, "'n' must be an integer between 1 and 128", param="n")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError(400, "'user' must be a string", param="user")
    if stream:
        # Exact token totals come from the engine's final usage chunk; ask for it always.
        body["stream_options"] = {**(options or {}), "include_usage": True}
    if not forward_priority:
        body.pop("priority", None)
    try:
        upstream_body = _COMPACT_JSON.encode(body).encode()
    except RecursionError:  # parsed just under the limit, but encoding recurses a bit deeper
        raise _too_deep() from None
    return ParsedCall(
        kind=kind,
        model=model,
        stream=stream,
        client_wants_usage=client_wants_usage,
        max_tokens=max_tokens * n,
        prompt_tokens=prompt_tokens,
        system_tokens=system_tokens,
        user=user,
        upstream_body=upstream_body,
    )
