"""A batch refused whole never splits its input file (it may be huge; splitting it costs a bytes
object per line, which stalled the event loop for seconds on a 35-million-line file)."""

from __future__ import annotations

import pytest

from fleetwarden.batch import maintenance
from fleetwarden.batch.records import BatchRecord
from fleetwarden.batch.validation import LineError

BATCH = BatchRecord("batch_x", "team-a", "/v1/chat/completions", "file-x", "24h", 0.0, 86400.0, 2)


def test_errors_without_line_numbers_do_not_split_the_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(content: bytes) -> list[bytes]:
        raise AssertionError("split_lines was called for errors naming no line")

    monkeypatch.setattr(maintenance, "split_lines", refuse)
    batch = BATCH
    errors = (LineError("too_many_requests", "too many", None),)
    lines = maintenance._error_lines(batch, b'{"a":1}\n' * 1000, errors)
    assert len(lines) == 1
    assert '"too_many_requests"' in lines[0]


def test_errors_with_line_numbers_still_name_the_custom_id() -> None:
    batch = BATCH
    content = b'{"custom_id":"a"}\n{"custom_id":"b"}\n'
    lines = maintenance._error_lines(batch, content, (LineError("x", "bad", 2),))
    assert '"custom_id":"b"' in lines[0]
