"""A Secret swapped between the sidecar's start-up read and the watcher's start is not missed.

The CLI reads the mounted secret files before the app (and its watcher) starts. The watcher must
compare against the file as the CLI read it: stamping the file only when the watcher starts would
take the swapped file as the baseline and keep the stale value until the next rotation.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import fleetwarden.sidecar.app as sidecar_app
from fleetwarden.cli import build_parser
from fleetwarden.sidecar.identity import InteractionTokens
from fleetwarden.sidecar.secret_watch import SecretWatcher, WatchedSecret, stamp_of
from tests.sidecar.test_secret_rotation import kubelet_mount

OLD_TOKEN, NEW_TOKEN = "admin-before-rotation", "admin-after-rotation"
OLD_KEY, NEW_KEY = "o" * 32, "n" * 32


def test_the_cli_start_up_read_is_the_watchers_baseline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubelet_mount(tmp_path, {"admin-token": OLD_TOKEN, "interaction-secret": OLD_KEY}, 1)
    built: list[web.Application] = []
    real_build_app = sidecar_app.build_app

    def build_app_after_a_rotation(settings: Any, config: Any) -> web.Application:
        # The CLI has read the files; the Secret is recreated before the app starts watching.
        kubelet_mount(tmp_path, {"admin-token": NEW_TOKEN, "interaction-secret": NEW_KEY}, 2)
        built.append(real_build_app(settings, config))
        return built[-1]

    monkeypatch.setattr(sidecar_app, "build_app", build_app_after_a_rotation)
    monkeypatch.setattr(web, "run_app", lambda app, **kwargs: None)  # start-up only, no serving
    monkeypatch.setattr("logging.basicConfig", lambda **kwargs: None)
    monkeypatch.setitem(sys.modules, "uvloop", None)  # keep the test's event loop policy
    args = build_parser().parse_args(
        [
            "sidecar",
            "--admin-token-file",
            str(tmp_path / "admin-token"),
            "--interaction-secret-file",
            str(tmp_path / "interaction-secret"),
        ]
    )
    frozen = gc.get_freeze_count()
    assert args.func(args) == 0
    # The start-up heap is frozen by a start-up hook, so only a serving process freezes it; one
    # that builds the app in-process (this test) keeps its collector as it was.
    assert gc.get_freeze_count() == frozen
    [app] = built
    assert any(h.__name__ == "freeze_startup_heap" for h in app.on_startup)
    state = app[sidecar_app.STATE]
    assert state.admin_token == OLD_TOKEN  # what the CLI read
    watcher = state.watch_secrets()  # what the app's start-up does, after the swap

    assert watcher.check_once() == 2  # the swap is seen on the first check
    assert state.admin_token == NEW_TOKEN
    fresh = state.tokens.issue("acme", "i-1", now_unix=1000.0)
    assert InteractionTokens(NEW_KEY.encode()).verify(fresh, "acme", now_unix=1001.0) == "i-1"
    assert watcher.check_once() == 0  # and applied once


def test_a_swap_between_the_stamp_and_the_read_is_applied_again_never_missed(
    tmp_path: Path,
) -> None:
    kubelet_mount(tmp_path, {"admin-token": "first"}, 1)
    path = tmp_path / "admin-token"
    stamps = {path.absolute(): stamp_of(path)}
    kubelet_mount(tmp_path, {"admin-token": "second"}, 2)  # swapped before the read
    in_force = path.read_text()
    seen: list[str] = []
    watched = WatchedSecret(path, seen.append, startup_stamps=stamps)
    watcher = SecretWatcher([watched], interval_s=1.0)
    assert watcher.check_once() == 1  # the value in force, applied once more: harmless
    assert seen == [in_force] == ["second"]
    kubelet_mount(tmp_path, {"admin-token": "third"}, 3)
    assert watcher.check_once() == 1
    assert watcher.check_once() == 0
    assert seen == ["second", "third"]


def test_a_file_not_read_at_start_up_is_stamped_when_watched(tmp_path: Path) -> None:
    kubelet_mount(tmp_path, {"admin-token": "first"}, 1)
    seen: list[str] = []
    watcher = SecretWatcher([WatchedSecret(tmp_path / "admin-token", seen.append)], interval_s=1)
    assert watcher.check_once() == 0
    assert seen == []
