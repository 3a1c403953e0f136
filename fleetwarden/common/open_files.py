"""Raise the process's soft limit on open files to its hard limit, for servers with many sockets.

Why: each streamed completion holds a client socket and an engine socket in the sidecar, and
two more while the C relay forwards it (its duplicates). Container runtimes commonly start processes with a soft limit of 1,024 and a hard limit far
above it (containerd 2 does), which a sidecar would reach near 256 concurrent streams: accepts
then fail with EMFILE. The hard limit is the one the operator of the node meant; raising the soft
limit up to it needs no privilege.
"""

from __future__ import annotations

import resource

UNLIMITED_TARGET = 1 << 20
"""Where the hard limit is unlimited: Linux's default cap on open files per process (nr_open)."""


def raise_open_files_limit() -> tuple[int, int]:
    """Soft limit before and after; unchanged where the hard limit is not above it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else UNLIMITED_TARGET
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # an unlimited hard limit the kernel caps (nr_open): keep it
        return soft, soft
    return soft, target


__all__ = ["raise_open_files_limit"]
