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
when the watcher starts: the CLI takes `stamp_of` each secret file just before it reads it and
passes the stamps on in `SidecarSettings.secret_stamps`; a `WatchedSecret` of that path starts
from that stamp (no module state: two sidecars in one process, as in the tests, keep their own).
A swap between the start-up read and the watcher's start is then applied on the first check
instead of being missed until the next one; a swap between the stamp and the read only applies
the value just read once more (harmless: the same admin token, a rekey to the key already in
force).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

FileStamp = tuple[int, int, int]


def stamp_of(path: Path) -> FileStamp | None:
    """What changes when the kubelet swaps the file: inode, mtime and size (None: unreadable).

    Take it just before reading a secret's start-up value: never newer than the value read, so a
    watcher that starts from it sees every later swap as a change."""
    try:
        status = os.stat(path)  # follows the kubelet's ..data symlink to the current file
    except OSError:
        return None
    return (status.st_ino, status.st_mtime_ns, status.st_size)


@dataclass
class WatchedSecret:
    """One mounted secret file and the callback that applies a new value of it."""

    path: Path
    apply: Callable[[str], None]
    min_length: int = 1
    startup_stamps: Mapping[Path, FileStamp | None] = field(default_factory=dict)
    """Stamps taken before the start-up reads, by absolute path (see the module docstring)."""
    stamp: FileStamp | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        # The stamp of the start-up read when there was one; else the file as it is now, for
        # values that did not come from this file at start-up.
        key = self.path.absolute()
        self.stamp = self.startup_stamps[key] if key in self.startup_stamps else stamp_of(key)

    def check(self) -> bool:
        """Re-read and apply the file if it changed since the last check; True if applied."""
        stamp = stamp_of(self.path)
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


__all__ = ["FileStamp", "SecretWatcher", "WatchedSecret", "stamp_of"]
