"""Counting an input file's lines without splitting it: `count_lines` gives exactly the answer
it gave when it was `len(split_lines(content))`, without one bytes object per line, and a file
over `max_lines` is refused by validation before anything splits it."""

from __future__ import annotations

import time
import tracemalloc
from unittest.mock import patch

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fleetwarden.batch import validation
from fleetwarden.batch.validation import (
    InputLimits,
    InvalidInput,
    ValidInput,
    count_lines,
    validate_input,
)
from tests.batch.builders import MODEL, chat_line, jsonl

BOM = b"\xef\xbb\xbf"
CHAT = "/v1/chat/completions"


def old_count_lines(content: bytes) -> int:
    """The previous implementation, verbatim in substance: split, then count the pieces."""
    if content.startswith(b"\xef\xbb\xbf"):
        content = content[3:]
    if not content:
        return 0
    lines = content.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return len([line[:-1] if line.endswith(b"\r") else line for line in lines])


PIECES = st.sampled_from([b"\n", b"\r", b"\r\n", b"a", b"ab", BOM, b"\xef", b"\xbb\xbf", b""])
CONTENT = st.one_of(st.binary(max_size=64), st.lists(PIECES, max_size=40).map(b"".join))


@given(content=CONTENT, step=st.integers(min_value=1, max_value=9))
@example(content=b"", step=1)
@example(content=BOM, step=1)
@example(content=BOM + b"\n", step=2)
@example(content=b"\n", step=1)
@example(content=b"a", step=1)
@example(content=b"a\n\n", step=3)
@example(content=b"\xef\xbb", step=1)
def test_count_lines_gives_the_old_answer(content: bytes, step: int) -> None:
    """On random bytes rich in newlines, CRs and (partial) BOMs, with the count's slices at
    every small size (so a slice edge falls on every position) and at the real size."""
    expected = old_count_lines(content)
    assert count_lines(content) == expected
    with patch.object(validation, "_COUNT_STEP", step):
        assert count_lines(content) == expected


def test_count_lines_does_not_materialise_the_lines() -> None:
    """1.4 million short lines: splitting them allocated about 60 MB (2 GB and 5-8 s for the
    100 MB a tenant may upload, on the event loop); counting allocates nothing."""
    lines = (4 << 20) // 3
    content = b"ab\n" * lines
    tracemalloc.start()
    try:
        started = time.perf_counter()
        counted = count_lines(content)
        elapsed = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert counted == lines
    assert peak < 64 * 1024, f"peak {peak} bytes"
    assert elapsed < 1.0


def test_a_file_over_max_lines_is_refused_before_it_is_split(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limits = InputLimits(max_line_bytes=2048, max_lines=3)

    def no_split(content: bytes) -> list[bytes]:
        raise AssertionError("a file over max_lines was split")

    monkeypatch.setattr(validation, "split_lines", no_split)
    for content in (b"x\n" * 4, BOM + b"x\n" * 3 + b"x", b"\n" * 1000):
        result = validate_input(content, CHAT, limits, {MODEL})
        assert isinstance(result, InvalidInput)
        [error] = result.errors
        assert (error.code, error.line, error.param) == ("too_many_requests", None, None)
        assert f"has {count_lines(content)} requests; at most 3" in error.message
        assert "split it into several batches" in error.message


def test_a_file_at_max_lines_is_still_validated_line_by_line() -> None:
    limits = InputLimits(max_line_bytes=2048, max_lines=3)
    content = BOM + jsonl([chat_line(f"id-{i}") for i in range(3)]).rstrip(b"\n")
    result = validate_input(content, CHAT, limits, {MODEL})
    assert isinstance(result, ValidInput)
    assert [item.custom_id for item in result.items] == ["id-0", "id-1", "id-2"]
    for empty in (b"", BOM):
        refused = validate_input(empty, CHAT, limits, {MODEL})
        assert isinstance(refused, InvalidInput)
        assert [e.code for e in refused.errors] == ["empty_file"]
