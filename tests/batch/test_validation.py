"""Input validation (pure), including fuzzed JSONL: never a silent drop, never a crash."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.batch.validation import (
    MAX_JSON_DEPTH,
    InputLimits,
    InvalidInput,
    ValidInput,
    WindowError,
    count_lines,
    parse_completion_window,
    split_lines,
    validate_input,
)
from tests.batch.builders import MODEL, chat_line

LIMITS = InputLimits(max_line_bytes=2048, max_lines=100)
CHAT = "/v1/chat/completions"


def check(lines: list[bytes], endpoint: str = CHAT) -> ValidInput | InvalidInput:
    return validate_input(b"\n".join(lines) + b"\n", endpoint, LIMITS, {MODEL})


def encoded(line: dict[str, Any]) -> bytes:
    return json.dumps(line).encode()


def test_a_valid_file_becomes_items_in_order() -> None:
    result = check([encoded(chat_line(f"id-{i}")) for i in range(3)])
    assert isinstance(result, ValidInput)
    assert result.model == MODEL
    assert [(i.idx, i.custom_id) for i in result.items] == [(0, "id-0"), (1, "id-1"), (2, "id-2")]
    assert json.loads(result.items[0].request_json) == chat_line("id-0")


def test_completions_need_a_prompt() -> None:
    line = {"custom_id": "p", "method": "POST", "url": "/v1/completions",
            "body": {"model": MODEL, "prompt": "hi"}}  # fmt: skip
    assert isinstance(check([encoded(line)], "/v1/completions"), ValidInput)
    del line["body"]["prompt"]
    result = check([encoded(line)], "/v1/completions")
    assert isinstance(result, InvalidInput)
    assert result.errors[0].code == "invalid_body"


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"[1, 2]", "invalid_json"),
        (b"\xff\xfe", "invalid_json"),
        (encoded({**chat_line("a"), "custom_id": 7}), "invalid_custom_id"),
        (encoded({**chat_line("a"), "custom_id": "x" * 600}), "invalid_custom_id"),
        (encoded({**chat_line("a"), "custom_id": ""}), "missing_custom_id"),
        (encoded({**chat_line("a"), "body": "text"}), "missing_body"),
        (encoded({**chat_line("a"), "body": {"messages": [{"role": "user"}]}}), "missing_model"),
        (encoded(chat_line("a", stream=True)), "invalid_body"),
        (encoded({**chat_line("a"), "body": {"model": MODEL, "messages": []}}), "invalid_body"),
        (encoded(chat_line("a", user="cut \ud83d")), "invalid_json"),  # a lone surrogate
        (encoded(chat_line("\udc00a")), "invalid_json"),  # in the custom_id, low half
    ],
)
def test_each_kind_of_bad_line_is_named(line: bytes, code: str) -> None:
    result = check([encoded(chat_line("ok")), line])
    assert isinstance(result, InvalidInput)
    assert [(e.line, e.code) for e in result.errors] == [(2, code)]


def nested(depth: int) -> bytes:
    """A valid chat line whose body nests objects and arrays `depth` levels deep in all."""
    value: object = "x"
    for level in range(depth - 4):  # below the line, its body, `messages` and the message
        value = [value] if level % 2 else {"k": value}
    line = chat_line("deep")
    line["body"]["messages"] = [{"role": "user", "content": "hi", "extra": value}]
    return encoded(line)


def test_nesting_is_bounded_so_accepted_lines_can_be_parsed_again_anywhere() -> None:
    limits = InputLimits(max_line_bytes=10**6, max_lines=10)
    at_limit = validate_input(nested(MAX_JSON_DEPTH) + b"\n", CHAT, limits, {MODEL})
    assert isinstance(at_limit, ValidInput)
    brackets_in_a_string = encoded(chat_line("text", user="[" * 1000))
    assert isinstance(validate_input(brackets_in_a_string, CHAT, limits, {MODEL}), ValidInput)
    for line in (nested(MAX_JSON_DEPTH + 1), b"[" * 100_000 + b"]" * 100_000):
        result = validate_input(line + b"\n", CHAT, limits, {MODEL})
        assert isinstance(result, InvalidInput)
        assert [(e.line, e.code) for e in result.errors] == [(1, "invalid_json")]
        assert f"more than {MAX_JSON_DEPTH} levels" in result.errors[0].message


def test_a_surrogate_pair_is_text_and_runs() -> None:
    result = check([b'{"custom_id":"e","method":"POST","url":"/v1/chat/completions","body":'
                    b'{"model":"%s","messages":[{"role":"user","content":"\\ud83d\\ude00"}]}}'
                    % MODEL.encode()])  # fmt: skip
    assert isinstance(result, ValidInput)
    assert "\U0001f600" in result.items[0].request_json


def test_a_second_model_in_one_batch_is_refused() -> None:
    result = validate_input(
        encoded(chat_line("a")) + b"\n" + encoded(chat_line("b", model="other")),
        CHAT,
        LIMITS,
        {MODEL, "other"},
    )
    assert isinstance(result, InvalidInput)
    assert [(e.line, e.code) for e in result.errors] == [(2, "mismatched_model")]


def test_file_level_problems() -> None:
    empty = validate_input(b"", CHAT, LIMITS, {MODEL})
    assert isinstance(empty, InvalidInput)
    assert empty.errors[0].code == "empty_file"
    many = check([encoded(chat_line(f"i{i}")) for i in range(101)])
    assert isinstance(many, InvalidInput)
    assert many.errors[0].code == "too_many_requests"
    wrong = check([encoded(chat_line("a"))], "/v1/embeddings")
    assert isinstance(wrong, InvalidInput)
    assert wrong.errors[0].code == "invalid_endpoint"


def test_line_splitting_tolerates_crlf_a_bom_and_no_final_newline() -> None:
    assert split_lines(b"\xef\xbb\xbfa\r\nb") == [b"a", b"b"]
    assert split_lines(b"a\n\nb\n") == [b"a", b"", b"b"]
    assert count_lines(b"a\nb\n") == count_lines(b"a\nb") == 2


@pytest.mark.parametrize(("text", "seconds"), [("24h", 86400), ("90m", 5400), ("2d", 172800)])
def test_completion_windows(text: str, seconds: float) -> None:
    assert parse_completion_window(text, 60, 7 * 86400) == seconds


@pytest.mark.parametrize("text", ["24", "h", "0h", "-1h", "1w", "30s", "8d", " 24h"])
def test_bad_completion_windows(text: str) -> None:
    with pytest.raises(WindowError):
        parse_completion_window(text, 60, 7 * 86400)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=6,
)
_good_lines = st.builds(lambda cid: encoded(chat_line(cid)), st.text(min_size=1, max_size=12))
_broken_lines = st.one_of(
    st.binary(max_size=40).filter(lambda b: b"\n" not in b),
    _json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(
        lambda cid, key, value: encoded({**chat_line(cid), key: value}),
        st.text(min_size=1, max_size=12),
        st.sampled_from(["custom_id", "method", "url", "body"]),
        _json_values,
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_good_lines, _broken_lines), min_size=1, max_size=25))
def test_fuzzed_files_either_run_whole_or_name_every_bad_line(lines: list[bytes]) -> None:
    content = b"\n".join(lines) + b"\n"
    result = validate_input(content, CHAT, LIMITS, {MODEL})
    n = len(split_lines(content))
    if isinstance(result, ValidInput):
        assert len(result.items) == n  # nothing dropped
        assert len({i.custom_id for i in result.items}) == n
        for item, raw in zip(result.items, split_lines(content), strict=True):
            assert json.loads(item.request_json)["custom_id"] == json.loads(raw)["custom_id"]
        return
    assert result.errors
    named = [e.line for e in result.errors]
    assert len(named) == len(set(named))  # one error per bad line
    for number in named:
        assert number is not None
        assert 1 <= number <= n
        # a named line on its own (with no duplicates to clash with) is itself invalid,
        # unless it was refused only for repeating an earlier custom_id
        alone = validate_input(split_lines(content)[number - 1] + b"\n", CHAT, LIMITS, {MODEL})
        error = next(e for e in result.errors if e.line == number)
        assert isinstance(alone, InvalidInput) or error.code == "duplicate_custom_id"
    # and every line not named is valid on its own
    for number in set(range(1, n + 1)) - set(named):
        alone = validate_input(split_lines(content)[number - 1] + b"\n", CHAT, LIMITS, {MODEL})
        assert isinstance(alone, ValidInput)
