"""What counts as a pod's answer to a config push, and what the pusher keeps out of sight.

Only the pod's own answer may acknowledge a push: a redirect used to be followed, so whatever the
redirect target answered counted as the pod's acknowledgement. The answer used to be read whole,
so a 50 MB one grew the operator by some 200 MB and was stored (and logged) as the "version".
And the admin bearer token used to show in the repr of the desired config (and of the pusher).
"""

from __future__ import annotations

import gzip
import logging
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from fleetwarden.operator import config_push
from fleetwarden.operator.config_push import ConfigPusher, DesiredConfig, PodTarget
from tests.support.eventually import eventually
from tests.support.sidecar_stack import serve

pytestmark = pytest.mark.timeout(60)
TOKEN = "s3cret-admin-token-for-the-test"
VERSION = "0123456789abcdef"
"""Shaped like `FairnessConfig.version`, the version a real sidecar answers with."""
DESIRED = DesiredConfig(VERSION, '{"version": "0123456789abcdef"}', TOKEN)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def app_with(put: Handler) -> web.Application:
    app = web.Application()
    app.router.add_put("/admin/config", put)
    return app


def acknowledging(calls: list[str]) -> web.Application:
    """A sidecar stand-in that acknowledges every push with the version it was sent."""

    async def put(request: web.Request) -> web.StreamResponse:
        await request.read()
        calls.append(request.host)
        return web.json_response({"version": VERSION, "changed": True})

    return app_with(put)


def answering(
    body: bytes, *, status: int = 200, content_type: str = "application/json"
) -> web.Application:
    async def put(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.Response(body=body, status=status, content_type=content_type)

    return app_with(put)


async def push_to(app: web.Application) -> str | None:
    pusher = ConfigPusher()
    try:
        async with serve(app, "127.0.0.21") as pod:
            return await pusher._push_once(PodTarget("ns/p", "ns/md", pod.url, True), DESIRED)
    finally:
        await pusher.close()


# -- redirects ----------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("same_host", [False, True])
async def test_a_redirect_is_a_failed_push_and_is_not_followed(
    status: int, same_host: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A 3xx from the pod address is no acknowledgement, whatever the redirect target says."""
    target_calls: list[str] = []
    redirected: list[str] = []
    async with serve(acknowledging(target_calls), "127.0.0.22") as target:

        async def put(request: web.Request) -> web.StreamResponse:
            await request.read()
            redirected.append(request.path)
            if same_host and request.path == "/elsewhere":
                return web.json_response({"version": VERSION, "changed": True})
            base = "" if same_host else target.url
            path = "/elsewhere" if same_host else "/admin/config"
            return web.Response(status=status, headers={"Location": f"{base}{path}"})

        app = app_with(put)
        app.router.add_put("/elsewhere", put)
        app.router.add_get("/elsewhere", put)
        with caplog.at_level(logging.WARNING, logger=config_push.__name__):
            assert await push_to(app) is None
    assert target_calls == []
    assert redirected == ["/admin/config"]
    assert any("redirect" in r.getMessage() for r in caplog.records)


async def test_a_redirecting_pod_is_retried_and_never_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(config_push, "FIRST_BACKOFF_S", 0.05)
    target_calls: list[str] = []
    redirected: list[str] = []
    async with serve(acknowledging(target_calls), "127.0.0.22") as target:

        async def put(request: web.Request) -> web.StreamResponse:
            await request.read()
            redirected.append(request.path)
            raise web.HTTPTemporaryRedirect(f"{target.url}/admin/config")

        pusher = ConfigPusher()
        async with serve(app_with(put), "127.0.0.23") as pod:
            pusher.set_desired("ns/md", DESIRED)
            pusher._observe(PodTarget("ns/p", "ns/md", pod.url, True))
            await eventually(lambda: len(redirected) >= 3, 10.0)
            assert pusher.counts("ns/md") == (0, 1)
        await pusher.close()
    assert target_calls == []


# -- the answer's size and shape ----------------------------------------------------------------


async def test_an_answer_larger_than_the_cap_is_refused_whatever_it_holds() -> None:
    padding = b"x" * (config_push.MAX_ANSWER_BYTES + 1)
    body = b'{"version": "' + VERSION.encode() + b'", "changed": true, "pad": "' + padding + b'"}'
    assert await push_to(answering(body)) is None


async def test_a_streamed_answer_is_read_no_further_than_the_cap() -> None:
    """Without a Content-Length the pusher stops reading past the cap; the 50 MB are never sent
    whole (the server would block on a full socket) and never end up in memory."""
    chunk = b"x" * 65536
    sent: list[int] = []

    async def put(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(b'{"version": "')
        for _ in range(800):  # 50 MB
            await response.write(chunk)
            sent.append(len(chunk))
        await response.write(b'"}')
        return response

    assert await push_to(app_with(put)) is None
    assert sum(sent) < 50_000_000


@pytest.mark.parametrize("inflated_bytes", [0, 20_000_000])
async def test_a_compressed_answer_is_refused_and_never_inflated(inflated_bytes: int) -> None:
    """The pusher asks for no compression and the sidecar uses none: a gzip answer (here a valid
    one, or a small one inflating to 20 MB) is not the sidecar's, and is not decompressed."""
    padding = b"x" * inflated_bytes
    answer = b'{"version": "' + VERSION.encode() + b'", "changed": true, "pad": "' + padding + b'"}'
    compressed = gzip.compress(answer)

    async def put(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.Response(
            body=compressed, content_type="application/json", headers={"Content-Encoding": "gzip"}
        )

    assert await push_to(app_with(put)) is None


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b'{"version": "' + b"v" * 1000 + b'", "changed": true}', "application/json"),
        (b'{"version": "v1\\nFAKE log line", "changed": true}', "application/json"),
        (b'{"version": "v1\\u001b[31m", "changed": true}', "application/json"),
        (b'{"version": "", "changed": true}', "application/json"),
        (b'{"version": 123, "changed": true}', "application/json"),
        (b'{"changed": true}', "application/json"),
        (b'{"version": "0123456789abcdef", "changed": "yes"}', "application/json"),
        (b'["0123456789abcdef"]', "application/json"),
        (b"[" * 60_000 + b"]" * 60_000, "application/json"),
        (b"not json at all", "application/json"),
        (b'{"version": "0123456789abcdef", "changed": true}', "text/html"),
    ],
    ids=[
        "long-version",
        "newline-in-version",
        "control-char-in-version",
        "empty-version",
        "number-version",
        "no-version",
        "changed-not-bool",
        "array",
        "deeply-nested",
        "not-json",
        "not-json-content-type",
    ],
)
async def test_answers_not_shaped_like_the_sidecars_are_refused(
    body: bytes, content_type: str
) -> None:
    assert await push_to(answering(body, content_type=content_type)) is None


@pytest.mark.parametrize("version", [VERSION, "their-version", "v1.2_3:4"])
async def test_the_sidecars_answer_is_accepted(version: str) -> None:
    calls: list[str] = []

    async def put(request: web.Request) -> web.StreamResponse:
        await request.read()
        calls.append(request.path)
        return web.json_response({"version": version, "changed": False})

    assert await push_to(app_with(put)) == version
    assert calls == ["/admin/config"]


async def test_a_huge_refusal_is_logged_briefly(caplog: pytest.LogCaptureFixture) -> None:
    body = b'{"error": {"message": "' + b"y" * 1_000_000 + b'"}}'
    with caplog.at_level(logging.WARNING, logger=config_push.__name__):
        assert await push_to(answering(body, status=500)) is None
    messages = [r.getMessage() for r in caplog.records if r.name == config_push.__name__]
    assert messages
    assert all(len(m) < 1000 for m in messages)


# -- the admin token ----------------------------------------------------------------------------


async def test_the_admin_token_is_in_no_repr() -> None:
    assert TOKEN not in repr(DESIRED)
    assert TOKEN not in str(DESIRED)
    pusher = ConfigPusher()
    pusher.set_desired("ns/md", DESIRED)
    assert TOKEN not in repr(pusher)
    # still part of equality: a rotated token is a new desired config, pushed again
    rotated = DesiredConfig(DESIRED.version, DESIRED.document, "another-token")
    assert rotated != DESIRED
    await pusher.close()


async def test_the_token_still_reaches_the_sidecar() -> None:
    seen: list[str | None] = []

    async def put(request: web.Request) -> web.StreamResponse:
        await request.read()
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"version": VERSION, "changed": True})

    assert await push_to(app_with(put)) == VERSION
    assert seen == [f"Bearer {TOKEN}"]
