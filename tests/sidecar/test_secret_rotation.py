"""A recreated sidecar Secret reaches running sidecars: new admin token, rotated interaction key.

The mount is laid out as the kubelet lays out a Secret volume (each key a symlink through `..data`
to a timestamped directory, updated by flipping `..data`), so the watcher is tested against the
update it will see in a pod. No kubelet runs here; the layout is the documented one.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp

from fleetwarden.sidecar.identity import InteractionTokens
from fleetwarden.sidecar.secret_watch import SecretWatcher, WatchedSecret
from tests.support.sidecar_stack import ADMIN_TOKEN, running_sidecar, running_stub

OLD_KEY = "k" * 32
NEW_KEY = "n" * 32


def kubelet_mount(root: Path, values: dict[str, str], generation: int) -> None:
    """Write `values` as the kubelet does: a new timestamped dir, then an atomic `..data` flip."""
    data_dir = root / f"..2026_11_22_{generation:04d}"
    data_dir.mkdir(parents=True)
    for key, value in values.items():
        (data_dir / key).write_text(value)
    flip = root / "..data_tmp"
    flip.symlink_to(data_dir.name)
    os.replace(flip, root / "..data")
    for key in values:
        link = root / key
        if not link.is_symlink():
            link.symlink_to(Path("..data") / key)


def test_a_flipped_mount_is_applied_once_and_bad_values_keep_the_old_one(tmp_path: Path) -> None:
    kubelet_mount(tmp_path, {"admin-token": "first"}, 1)
    seen: list[str] = []
    secret = WatchedSecret(tmp_path / "admin-token", seen.append, min_length=4)
    watcher = SecretWatcher([secret], interval_s=1.0)
    assert watcher.check_once() == 0  # unchanged since start-up: nothing re-applied
    kubelet_mount(tmp_path, {"admin-token": "second\n"}, 2)
    assert watcher.check_once() == 1
    assert watcher.check_once() == 0
    assert seen == ["second"]
    kubelet_mount(tmp_path, {"admin-token": "x"}, 3)  # too short: logged, old value kept
    assert watcher.check_once() == 0
    (tmp_path / "..data").unlink()  # the mount vanished mid-swap: keep the old value
    assert watcher.check_once() == 0
    kubelet_mount(tmp_path, {"admin-token": "third"}, 4)
    assert watcher.check_once() == 1
    assert seen == ["second", "third"]


def test_rekeyed_tokens_verify_with_the_previous_key_but_not_older_ones() -> None:
    tokens = InteractionTokens(OLD_KEY.encode())
    before = tokens.issue("acme", "i-1", now_unix=1000.0)
    tokens.rekey(NEW_KEY.encode())
    after = tokens.issue("acme", "i-2", now_unix=1000.0)
    assert before != tokens.issue("acme", "i-1", now_unix=1000.0)  # signed with the new key
    assert tokens.verify(before, "acme", now_unix=1001.0) == "i-1"
    assert tokens.verify(after, "acme", now_unix=1001.0) == "i-2"
    assert tokens.verify(before, "other", now_unix=1001.0) is None
    tokens.rekey(NEW_KEY.encode())  # the same key again keeps the previous one
    assert tokens.verify(before, "acme", now_unix=1001.0) == "i-1"
    tokens.rekey(("z" * 32).encode())
    assert tokens.verify(before, "acme", now_unix=1001.0) is None  # two keys ago: a new one
    assert tokens.verify(after, "acme", now_unix=1001.0) == "i-2"


async def _admin_status(http: aiohttp.ClientSession, url: str, token: str) -> int:
    async with http.get(f"{url}/admin/state", headers={"Authorization": f"Bearer {token}"}) as r:
        return r.status


async def test_a_running_sidecar_follows_a_recreated_secret(tmp_path: Path) -> None:
    kubelet_mount(tmp_path, {"admin-token": ADMIN_TOKEN, "interaction-secret": OLD_KEY}, 1)
    async with (
        running_stub(time_scale=0.1) as stub,
        running_sidecar(
            stub.url,
            admin_token_file=tmp_path / "admin-token",
            interaction_secret_file=tmp_path / "interaction-secret",
            interaction_secret=OLD_KEY.encode(),
            secret_poll_s=0.02,
        ) as sc,
        aiohttp.ClientSession() as http,
    ):
        assert await _admin_status(http, sc.url, ADMIN_TOKEN) == 200
        issued = sc.state.tokens.issue("acme", "i-1", now_unix=1000.0)
        kubelet_mount(tmp_path, {"admin-token": "rotated", "interaction-secret": NEW_KEY}, 2)
        for _ in range(250):
            if await _admin_status(http, sc.url, "rotated") == 200:
                break
            await asyncio.sleep(0.02)
        assert await _admin_status(http, sc.url, "rotated") == 200
        assert await _admin_status(http, sc.url, ADMIN_TOKEN) == 401
        assert sc.state.tokens.verify(issued, "acme", now_unix=1001.0) == "i-1"
        fresh = sc.state.tokens.issue("acme", "i-2", now_unix=1000.0)
        assert InteractionTokens(NEW_KEY.encode()).verify(fresh, "acme", 1001.0) == "i-2"
