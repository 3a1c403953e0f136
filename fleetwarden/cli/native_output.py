"""Keep a command's standard output its own while native libraries run.

A command that prints a JSON document (`fleetwarden plan --json`) owns its stdout: a script pipes
it to `jq`. Native libraries write to file descriptor 1 behind Python's back, so redirecting
`sys.stdout` cannot stop them. HiGHS 1.16, for one, prints its copyright banner when the first
solver of the process is constructed, before any option (`output_flag`) can be set, and that line
went in front of the plan's JSON. While the command computes, descriptor 1 therefore points at
stderr: native chatter stays visible to a person at a terminal and out of the document; nothing
is discarded.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["native_stdout_to_stderr"]


def _flush_c_stdio() -> None:
    """Flush the C library's buffered streams: into a pipe C's stdout is block-buffered, so a
    line printed by native code would otherwise leave its buffer only after descriptor 1 is back."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no C library to load, or no fflush in it: nothing to flush
        return


@contextmanager
def native_stdout_to_stderr() -> Iterator[None]:
    """Within the block, writes to file descriptor 1 go to descriptor 2.

    Python's own `sys.stdout` is flushed first, so what the command printed before the block keeps
    its place; what it prints inside stays in `sys.stdout`'s buffer unless that fills. Where the
    descriptors cannot be duplicated (a closed stdout), the block runs unchanged.
    """
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        _flush_c_stdio()
        os.dup2(saved, 1)
        os.close(saved)
