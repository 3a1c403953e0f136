"""Output and error files of a finished batch, built from its stored results (shared by stores).

Each item's result is stored as one string: `o` + output line, `e` + error line, or a one-letter
marker for items the batch itself settled (expired, cancelled). Lines are written in input order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleetwarden.batch.ids import new_file_id
from fleetwarden.batch.records import BatchRecord, FileKind, FileRecord
from fleetwarden.batch.results import marker_line

OUTPUT_PREFIX = "o"
ERROR_PREFIX = "e"


def encode_result(ok: bool, line: str) -> str:
    """The stored form of an engine result."""
    return (OUTPUT_PREFIX if ok else ERROR_PREFIX) + line


@dataclass(frozen=True, slots=True)
class BatchFiles:
    """The files to publish with a batch's final status; None when a file would be empty."""

    output: FileRecord | None
    output_content: bytes
    error: FileRecord | None
    error_content: bytes


def assemble(batch: BatchRecord, results: Iterable[tuple[int, str, str]], now: float) -> BatchFiles:
    """Build the files from `(idx, custom_id, stored result)` rows in any order."""
    output: list[str] = []
    errors: list[str] = []
    for idx, custom_id, stored in sorted(results):
        head, line = stored[:1], stored[1:]
        if head == OUTPUT_PREFIX:
            output.append(line)
        elif head == ERROR_PREFIX:
            errors.append(line)
        else:
            errors.append(marker_line(head, batch.id, idx, custom_id))
    out_bytes = "".join(f"{line}\n" for line in output).encode()
    err_bytes = "".join(f"{line}\n" for line in errors).encode()
    return BatchFiles(
        _record(batch, FileKind.OUTPUT, out_bytes, len(output), now),
        out_bytes,
        _record(batch, FileKind.ERROR, err_bytes, len(errors), now),
        err_bytes,
    )


def _record(
    batch: BatchRecord, kind: FileKind, content: bytes, lines: int, now: float
) -> FileRecord | None:
    if not lines:
        return None
    return FileRecord(
        id=new_file_id(),
        tenant=batch.tenant,
        filename=f"{batch.id}_{kind.value}.jsonl",
        purpose="batch_output",
        size_bytes=len(content),
        created_at=now,
        lines=lines,
        kind=kind,
        batch_id=batch.id,
    )


def validation_error_file(
    batch: BatchRecord, lines: Iterable[str], now: float
) -> tuple[FileRecord | None, bytes]:
    """The error file of a batch that failed validation: one line per bad input line."""
    text = list(lines)
    content = "".join(f"{line}\n" for line in text).encode()
    return _record(batch, FileKind.ERROR, content, len(text), now), content
