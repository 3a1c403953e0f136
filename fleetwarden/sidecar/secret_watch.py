"""Follow the mounted sidecar Secret when it changes, so a running pod never keeps a stale token.

The operator keeps one Secret per ModelDeployment with the admin bearer token and the HMAC key of
interaction tokens. If someone deletes it, the operator creates a new one with new values and
pushes configs with the new token; the kubelet swaps the mounted files in place (an atomic
symlink flip, within its sync period), but a sidecar that read them once at start-up would answer
every push 401 until the pod restarts. This watcher re-reads the files when their identity
(inode, mtime, size) changes and applies the new values:

- the admin token is replaced at once;
- the interaction key is rotated, and the previous key still verifies tokens, so interactions
  already under way stay continuations while the pods of a Deployment pick up the new key at
  slightly different times.

A file that cannot be read, is empty, or holds a key that is too short keeps the value in force
and is logged: a half-written or missing mount must not disable the admin API or the key.

The watcher compares against the file as it was when the value in force was read, not as it is
when the watcher starts: the CLI calls `stamp_startup_read` just before it reads a secret file, and
a `WatchedSecret` of that path starts from that stamp. A swap between the start-up read and the
watcher's start is then applied on the first check instead of being missed until the next one; a
swap between the stamp and the read only applies the value just read once more (harmless: the
same admin token, a rekey to the key already in force).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

FileStamp = tuple[int, int, int]


def _stamp(path: Path) -> FileStamp | None:
    """What changes when the kubelet swaps the file: inode, mtime and size (None: unreadable)."""
    try:
        status = os.stat(path)  # follows the kubelet's ..data symlink to the current file
    except OSError:
        return None
    return (status.st_ino, status.st_mtime_ns, status.st_size)


_startup_stamps: dict[Path, FileStamp | None] = {}
"""Per secret file, its stamp taken just before the process read its start-up value."""


def stamp_startup_read(path: Path) -> None:
    """Record `path`'s stamp; call it just before reading the value the process starts with.

    Taken before the read, the stamp is never newer than the value read, so a `WatchedSecret` of
    `path` created later (when the app starts) sees every swap since then as a change.
    """
    _startup_stamps[path.absolute()] = _stamp(path)


@dataclass
class WatchedSecret:
    """One mounted secret file and the callback that applies a new value of it."""

    path: Path
    apply: Callable[[str], None]
    min_length: int = 1
    stamp: FileStamp | None = None

    def __post_init__(self) -> None:
        # The stamp of the start-up read when there was one (see the module docstring); else the
        # file as it is now, for values that did not come from this file at start-up.
        key = self.path.absolute()
        self.stamp = _startup_stamps[key] if key in _startup_stamps else _stamp(self.path)

    def check(self) -> bool:
        """Re-read and apply the file if it changed since the last check; True if applied."""
        stamp = _stamp(self.path)
        if stamp is None or stamp == self.stamp:
            return False
        try:
            value = self.path.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("cannot re-read secret file %s (keeping the old value): %s", self.path, exc)
            return False
        self.stamp = stamp
        if len(value.encode()) < self.min_length:
            log.error(
                "secret file %s now holds %d bytes, fewer than %d: keeping the old value",
                self.path,
                len(value.encode()),
                self.min_length,
            )
            return False
        self.apply(value)
        log.info("secret file %s changed: new value applied", self.path)
        return True


class SecretWatcher:
    """Poll a few mounted secret files and apply their changes (see the module docstring)."""

    def __init__(self, secrets: list[WatchedSecret], *, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._secrets = secrets
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def check_once(self) -> int:
        """Check every file now; the number of new values applied."""
        return sum(secret.check() for secret in self._secrets)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            self.check_once()

    def start(self) -> None:
        if self._secrets:
            self._task = asyncio.create_task(self._run(), name="fleetwarden-secret-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


__all__ = ["SecretWatcher", "WatchedSecret", "stamp_startup_read"]
