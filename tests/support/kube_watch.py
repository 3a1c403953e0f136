"""Watch streams: replay from a resourceVersion, then follow the change log live.

What clients rely on, and the real server does: ``resourceVersion`` absent or
``0`` sends the current objects as ADDED first; a later one resumes strictly
after it; a compacted one answers an ERROR event with 410 Gone (Kopf then
re-lists); ``timeoutSeconds`` closes the stream; ``allowWatchBookmarks``
yields periodic BOOKMARKs; ``sendInitialEvents`` ends the initial burst with
the ``k8s.io/initial-events-end`` bookmark. With selectors, objects that start
matching arrive as ADDED and objects that stop matching as DELETED.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
import dataclasses
import itertools
import json
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import aiohttp.web

from tests.support import kube_errors as errors
from tests.support.kube_collections import selectors
from tests.support.kube_resources import ResourceType
from tests.support.kube_routing import Route
from tests.support.kube_store import ClusterState, Obj, WatchEvent


@dataclasses.dataclass(frozen=True)
class WatchInfo:
    """An open watch stream; readiness checks wait for these to appear."""

    group: str
    version: str
    plural: str
    kind: str
    namespace: str | None
    label_selector: str
    field_selector: str


class Notifier:
    """Wakes every watcher (and ``wait_for`` poller) after each committed change."""

    def __init__(self) -> None:
        self.changed = asyncio.Event()
        self.closing = False
        self.watches: dict[int, WatchInfo] = {}
        self._ids = itertools.count()

    def notify(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    def close(self) -> None:
        self.closing = True
        self.notify()

    def register(self, info: WatchInfo) -> int:
        watch_id = next(self._ids)
        self.watches[watch_id] = info
        return watch_id


@dataclasses.dataclass(frozen=True)
class WatchOptions:
    bookmark_interval: float
    max_watch_timeout: float | None


async def serve_watch(
    raw_request: aiohttp.web.BaseRequest,
    state: ClusterState,
    notifier: Notifier,
    rt: ResourceType,
    route: Route,
    query: Mapping[str, str],
    options: WatchOptions,
) -> aiohttp.web.StreamResponse:
    """Stream watch events for ``rt`` until the timeout, the client, or the emulator ends it."""
    selected = selectors(query, route.name)
    namespace = route.namespace

    def visible(obj: Obj | None) -> bool:
        if obj is None:
            return False
        return (namespace is None or obj["metadata"].get("namespace") == namespace) and selected(
            obj
        )

    since = query.get("resourceVersion") or ""
    if since not in ("", "0") and not since.isdigit():
        raise errors.bad_request(f"invalid resource version: {since!r}")
    send_initial = query.get("sendInitialEvents") == "true"
    bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
    timeout = options.max_watch_timeout
    if query.get("timeoutSeconds"):
        try:
            timeout = float(query["timeoutSeconds"])
        except ValueError:
            raise errors.bad_request("invalid timeoutSeconds") from None
        if options.max_watch_timeout is not None:
            timeout = min(timeout, options.max_watch_timeout)

    response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(raw_request)
    loop = asyncio.get_running_loop()
    watch_id = notifier.register(
        WatchInfo(
            rt.group,
            rt.version,
            rt.plural,
            rt.kind,
            namespace,
            query.get("labelSelector", ""),
            query.get("fieldSelector", ""),
        )
    )

    async def send(event_type: str, obj: Obj) -> None:
        await response.write(json.dumps({"type": event_type, "object": obj}).encode() + b"\n")

    def bookmark(rv: int, initial_end: bool = False) -> Obj:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}

    try:
        if since in ("", "0") or send_initial:
            position = state.rv
            for obj in state.select(rt, namespace, selected):
                await send("ADDED", state.render(rt, obj))
            if send_initial and bookmarks:
                await send("BOOKMARK", bookmark(position, initial_end=True))
        else:
            position = int(since)
        deadline = loop.time() + timeout if timeout is not None else None
        last_bookmark = loop.time()
        while not notifier.closing:
            changed = notifier.changed  # taken before scanning: no change can slip through
            if position < state.compacted_rv:
                message = f"too old resource version: {position} ({state.compacted_rv + 1})"
                await send("ERROR", errors.gone(message).status())
                break
            events = state.events
            for event in events[bisect.bisect_right(events, position, key=lambda e: e.rv) :]:
                position = event.rv
                translated = translate(state, event, rt, visible)
                if translated is not None:
                    await send(*translated)
            now = loop.time()
            if deadline is not None and now >= deadline:
                break
            if bookmarks and now - last_bookmark >= options.bookmark_interval:
                await send("BOOKMARK", bookmark(position))
                last_bookmark = now
            waits = [options.bookmark_interval - (now - last_bookmark)] if bookmarks else []
            if deadline is not None:
                waits.append(deadline - now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    changed.wait(), timeout=max(0.0, min(waits)) if waits else None
                )
        await response.write_eof()
    except (ConnectionError, aiohttp.ClientConnectionResetError):
        pass  # the client went away; nothing to clean up but the registration
    finally:
        notifier.watches.pop(watch_id, None)
    return response


def translate(
    state: ClusterState,
    event: WatchEvent,
    rt: ResourceType,
    visible: Callable[[Obj | None], bool],
) -> tuple[str, Obj] | None:
    """What a watcher of ``rt`` with these filters sees of a change, if anything."""
    if event.storage_key != rt.storage_key:
        return None
    if event.type == "ADDED":
        return ("ADDED", state.render(rt, event.obj)) if visible(event.obj) else None
    if event.type == "DELETED":
        shown = visible(event.obj) or visible(event.prev)
        return ("DELETED", state.render(rt, event.obj)) if shown else None
    now_visible, was_visible = visible(event.obj), visible(event.prev)
    if now_visible and was_visible:
        return "MODIFIED", state.render(rt, event.obj)
    if now_visible:
        return "ADDED", state.render(rt, event.obj)
    if was_visible and event.prev is not None:
        gone = copy.deepcopy(event.prev)
        gone["metadata"]["resourceVersion"] = str(event.rv)
        return "DELETED", state.render(rt, gone)
    return None
