"""Up-front validation of batch input files (pure).

Every line is checked before any is queued, and every bad line is reported with its number: a
batch either starts with all of its lines or fails with the full list of problems, never runs a
silently shortened subset. The checks are the ones that would otherwise only surface hours later,
when the item reaches an engine: JSON syntax, the `custom_id` contract, method, URL, model and
the shape of the body.

"JSON syntax" is strict on purpose: a line the service accepts must be safe to store, dispatch
and render again anywhere, or one bad line would fail later, far from its batch, in code shared
by every tenant (a queued item that cannot be stored or claimed blocks the whole queue). So lone
UTF-16 surrogate escapes such as `"\\ud83d"` (not Unicode text; I-JSON, RFC 7493, forbids them,
and they cannot be encoded as UTF-8) and nesting deeper than `MAX_JSON_DEPTH` are `invalid_json`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from fleetwarden.batch.records import ENDPOINTS, LineError, NewItem

MAX_CUSTOM_ID_CHARS = 512
"""Longer ids are almost always a client bug (a whole prompt pasted as the id)."""

MAX_JSON_DEPTH = 128
"""Deepest nesting of objects and arrays a line may have. Real requests (messages, tools, JSON
schemas) stay far below it; far deeper input exhausts Python's recursion limit when a line is
parsed or serialised again (a worker thread's claim, the dispatcher's POST)."""

_WINDOW = re.compile(r"^([1-9][0-9]{0,6})([smhd])$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class WindowError(ValueError):
    """A completion window that is malformed or outside the allowed range."""


def parse_completion_window(text: str, min_s: float, max_s: float) -> float:
    """Seconds in a completion window such as `24h` (units s, m, h, d).

    OpenAI accepts only `24h`; other values are a fleetwarden extension, bounded by config.
    """
    match = _WINDOW.match(text)
    if match is None:
        raise WindowError(f"completion_window {text!r} must look like 24h (units s, m, h, d)")
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
    if not min_s <= seconds <= max_s:
        raise WindowError(f"completion_window {text!r} must be between {min_s:g} s and {max_s:g} s")
    return seconds


@dataclass(frozen=True, slots=True)
class InputLimits:
    """Bounds on one input file."""

    max_line_bytes: int
    max_lines: int


@dataclass(frozen=True, slots=True)
class ValidInput:
    """Every line is a valid request for `model`."""

    items: tuple[NewItem, ...]
    model: str


@dataclass(frozen=True, slots=True)
class InvalidInput:
    """The file cannot run; `errors` names every bad line (or the whole file, line None)."""

    errors: tuple[LineError, ...]


_BOM = b"\xef\xbb\xbf"


def split_lines(content: bytes) -> list[bytes]:
    """The file's lines: split on LF, a trailing CR dropped, one final empty segment ignored.

    The final segment is the text after the last newline; files conventionally end with one.
    Any other empty line is kept and reported as invalid, not skipped.

    This makes one bytes object per line (a 100 MB file of short lines: 35 million objects,
    about 2 GB, seconds holding the GIL): check `count_lines` against a bound first.
    """
    if content.startswith(_BOM):
        content = content[len(_BOM) :]
    if not content:
        return []
    lines = content.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


_COUNT_STEP = 1 << 20
"""Bytes `count_lines` searches per `bytes.count` call: each call holds the GIL throughout, so
on a worker thread a 100 MB file would otherwise stall the event loop for its whole count."""


def count_lines(content: bytes) -> int:
    """How many lines `split_lines` finds, without making them: `bytes.count` over the file
    (about 40 ms and no memory for 100 MB), so the API and validation can bound a file
    before anything splits it."""
    start = len(_BOM) if content.startswith(_BOM) else 0
    if len(content) == start:
        return 0
    newlines = sum(
        content.count(b"\n", at, at + _COUNT_STEP) for at in range(start, len(content), _COUNT_STEP)
    )
    return newlines if content.endswith(b"\n") else newlines + 1


_TOO_DEEP = f"objects and arrays are nested more than {MAX_JSON_DEPTH} levels deep"


class JsonLineError(ValueError):
    """A line that is not strict JSON (see the module docstring); the message is for the client."""


def parse_json_line(raw: bytes) -> Any:
    """The JSON value of one line, or JsonLineError for invalid UTF-8, invalid JSON or nesting
    beyond `MAX_JSON_DEPTH` (lone surrogates are checked on the canonical line, see
    `_check_line`)."""
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JsonLineError(f"not a JSON object: {exc}") from exc
    except RecursionError as exc:  # the C parser gives up near the interpreter's limit
        raise JsonLineError(_TOO_DEEP) from exc
    if isinstance(value, dict | list) and _too_deep(value):
        raise JsonLineError(_TOO_DEEP)
    return value


def _too_deep(value: Any) -> bool:
    """Whether `value` nests deeper than `MAX_JSON_DEPTH`; iterative, so it cannot recurse."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def validate_input(
    content: bytes, endpoint: str, limits: InputLimits, served_models: Collection[str]
) -> ValidInput | InvalidInput:
    """Check every line of `content` for a batch against `endpoint`."""
    if endpoint not in ENDPOINTS:
        return InvalidInput((LineError("invalid_endpoint", f"unsupported endpoint {endpoint}"),))
    # Counted before splitting: a file over the bound is refused without ever being split
    count = count_lines(content)
    if not count:
        return InvalidInput((LineError("empty_file", "the input file has no requests"),))
    if count > limits.max_lines:
        return InvalidInput(
            (
                LineError(
                    "too_many_requests",
                    f"the input file has {count} requests; at most {limits.max_lines} per "
                    "batch: split it into several batches",
                ),
            )
        )
    lines = split_lines(content)
    errors: list[LineError] = []
    items: list[NewItem] = []
    first_line_of: dict[str, int] = {}
    model: str | None = None
    for idx, raw in enumerate(lines):
        number = idx + 1
        checked = _check_line(raw, number, endpoint, limits, served_models)
        if isinstance(checked, LineError):
            errors.append(checked)
            continue
        custom_id, line_model, canonical = checked
        if custom_id in first_line_of:
            errors.append(
                LineError(
                    "duplicate_custom_id",
                    f"custom_id {custom_id!r} already used on line {first_line_of[custom_id]}",
                    number,
                    "custom_id",
                )
            )
            continue
        first_line_of[custom_id] = number
        if model is None:
            model = line_model
        elif line_model != model:
            errors.append(
                LineError(
                    "mismatched_model",
                    f"model {line_model!r} differs from {model!r}; one model per batch",
                    number,
                    "body.model",
                )
            )
            continue
        items.append(NewItem(idx, custom_id, canonical))
    if errors or model is None:
        return InvalidInput(tuple(errors))
    return ValidInput(tuple(items), model)


def _check_line(
    raw: bytes, number: int, endpoint: str, limits: InputLimits, served_models: Collection[str]
) -> LineError | tuple[str, str, str]:
    """One line: an error, or (custom_id, model, canonical JSON)."""
    if len(raw) > limits.max_line_bytes:
        return LineError(
            "line_too_large",
            f"line is {len(raw)} bytes; at most {limits.max_line_bytes}",
            number,
        )
    try:
        parsed = parse_json_line(raw)
    except JsonLineError as exc:
        return LineError("invalid_json", str(exc), number)
    if not isinstance(parsed, dict):
        return LineError("invalid_json", "each line must be a JSON object", number)
    custom_id = parsed.get("custom_id")
    if custom_id is None or custom_id == "":
        return LineError("missing_custom_id", "custom_id is required", number, "custom_id")
    if not isinstance(custom_id, str) or len(custom_id) > MAX_CUSTOM_ID_CHARS:
        return LineError(
            "invalid_custom_id",
            f"custom_id must be a string of at most {MAX_CUSTOM_ID_CHARS} characters",
            number,
            "custom_id",
        )
    if parsed.get("method") != "POST":
        return LineError("invalid_method", "method must be POST", number, "method")
    if parsed.get("url") != endpoint:
        return LineError(
            "invalid_url",
            f"url {parsed.get('url')!r} does not match the batch endpoint {endpoint}",
            number,
            "url",
        )
    body = parsed.get("body")
    if not isinstance(body, dict):
        return LineError("missing_body", "body must be a JSON object", number, "body")
    problem = _check_body(body, endpoint, served_models)
    if problem is not None:
        code, message, param = problem
        return LineError(code, message, number, param)
    canonical = json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": endpoint, "body": body},
        separators=(",", ":"),
        ensure_ascii=False,
    )
    try:
        canonical.encode("utf-8")  # what every store does with it; fail here, not there
    except UnicodeEncodeError:
        return LineError(
            "invalid_json",
            "the line contains a lone UTF-16 surrogate escape (such as \\ud83d without its "
            "pair), which is not Unicode text",
            number,
        )
    return custom_id, body["model"], canonical


def _check_body(
    body: dict[str, Any], endpoint: str, served_models: Collection[str]
) -> tuple[str, str, str] | None:
    """The body checks that an engine would otherwise fail on hours later."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return "missing_model", "body.model is required", "body.model"
    if model not in served_models:
        return "model_not_found", f"model {model!r} is not served here", "body.model"
    if body.get("stream"):
        return "invalid_body", "streaming is not supported in a batch", "body.stream"
    if endpoint == "/v1/chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "invalid_body", "body.messages must be a non-empty list", "body.messages"
    elif "prompt" not in body:
        return "invalid_body", "body.prompt is required", "body.prompt"
    return None
