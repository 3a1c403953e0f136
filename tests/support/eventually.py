"""Polling for a condition in async tests: the one way the end-to-end tests wait for a
controller, an exporter or a subprocess to catch up, never a fixed sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def eventually(
    check: Callable[[], bool], timeout_s: float = 60.0, poll_s: float = 0.1
) -> None:
    """Return once `check()` is true; fail the test after `timeout_s` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached in {timeout_s:g} s")
        await asyncio.sleep(poll_s)
