"""Fuzzing the sidecar's HTTP API: whatever arrives, the answer is a 2xx or an OpenAI-style 4xx,
never a 5xx, a hang or a crash.

The sidecar runs for real in a background thread; the engine behind it is an instant fake that
answers every completion at once (no GPU here, and the point is the sidecar's input handling, so
an engine that takes time per token would only slow the fuzzer down).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.sidecar_stack import ADMIN_TOKEN, running_sidecar, serve

MAX_BODY = 64 * 1024
PATHS = ["/v1/chat/completions", "/v1/completions"]


async def _instant(request: web.Request) -> web.Response:
    await request.read()
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    return web.json_response(
        {"id": "x", "object": "text_completion", "choices": [], "usage": usage}
    )


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(text="vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n")


def _instant_engine() -> web.Application:
    app = web.Application()
    for path in PATHS:
        app.router.add_post(path, _instant)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/v1/models", _metrics)
    return app


@pytest.fixture(scope="module")
def sidecar_port() -> Iterator[int]:
    loop = asyncio.new_event_loop()
    ready: list[int] = []
    stop = asyncio.Event()

    async def main() -> None:
        async with (
            serve(_instant_engine()) as engine,
            running_sidecar(engine.url, max_body_bytes=MAX_BODY, queue_per_tenant=10_000) as sc,
        ):
            ready.append(int(sc.url.rsplit(":", 1)[1]))
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    while not ready:
        thread.join(0.01)
    yield ready[0]
    loop.call_soon_threadsafe(stop.set)
    thread.join(5)


def _call(
    port: int, method: str, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _assert_sane(status: int, payload: bytes) -> None:
    assert status < 500, (status, payload[:300])
    if status >= 400:
        error = json.loads(payload)["error"]
        assert isinstance(error["message"], str)
        assert error["message"]
        assert isinstance(error["type"], str)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
field_values = json_values | st.integers(min_value=-(2**70), max_value=2**70)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": field_values | st.just("m"),
        "messages": field_values
        | st.lists(
            st.fixed_dictionaries(
                {
                    "role": field_values | st.just("user"),
                    "content": field_values | st.text(max_size=50),
                }
            ),
            max_size=3,
        ),
        "prompt": field_values | st.text(max_size=50),
        "max_tokens": field_values | st.integers(min_value=-5, max_value=2_000_000),
        "stream": field_values,
        "stream_options": field_values,
        "n": field_values,
        "user": field_values,
        "priority": field_values,
    },
)
# Header values the HTTP grammar allows (visible ASCII, space, obs-text). Bytes outside it (DEL,
# controls) are refused by aiohttp's HTTP parser with a plain 400 before any route runs: see
# test_malformed_http_is_a_400_from_the_protocol_layer.
header_text = st.text(
    st.characters(min_codepoint=32, max_codepoint=255, blacklist_characters="\x7f"), max_size=40
)
headers = st.fixed_dictionaries(
    {},
    optional={
        "x-fleetwarden-tenant": header_text,
        "x-fleetwarden-app": header_text,
        "x-fleetwarden-tier": header_text | st.sampled_from(["iw-f", "iw-n", "niw"]),
        "x-fleetwarden-deadline-ms": header_text,
        "x-fleetwarden-stage": header_text,
        "x-fleetwarden-interaction": header_text,
        "Content-Type": st.sampled_from(
            ["application/json", "text/plain", "application/x-www-form-urlencoded"]
        ),
    },
)

FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(path=st.sampled_from(PATHS), body=bodies, extra=headers)
def test_structured_bodies_and_headers(
    sidecar_port: int, path: str, body: dict[str, object], extra: dict[str, str]
) -> None:
    status, payload = _call(sidecar_port, "POST", path, json.dumps(body).encode(), extra)
    _assert_sane(status, payload)


@FUZZ
@given(path=st.sampled_from([*PATHS, "/admin/config"]), raw=st.binary(max_size=2000))
def test_arbitrary_bytes(sidecar_port: int, path: str, raw: bytes) -> None:
    method = "PUT" if path.startswith("/admin") else "POST"
    status, payload = _call(
        sidecar_port, method, path, raw, {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    _assert_sane(status, payload)
    assert 400 <= status < 500 or status == 200


@FUZZ
@given(
    document=st.dictionaries(
        st.sampled_from(["policy", "tenants", "gate", "source", "tiers", "drr", "x"]),
        json_values,
        max_size=5,
    )
)
def test_admin_config_documents(sidecar_port: int, document: dict[str, object]) -> None:
    status, payload = _call(
        sidecar_port,
        "PUT",
        "/admin/config",
        json.dumps(document).encode(),
        {"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert status in (400, 422), payload
    _assert_sane(status, payload)


def test_huge_body_is_413(sidecar_port: int) -> None:
    body = json.dumps({"model": "m", "prompt": "x" * (MAX_BODY + 10)}).encode()
    status, payload = _call(sidecar_port, "POST", "/v1/completions", body, {})
    assert status == 413
    _assert_sane(status, payload)


def test_unknown_routes_and_methods(sidecar_port: int) -> None:
    for method, path in (
        ("GET", "/nope"),
        ("DELETE", "/admin/config"),
        ("GET", "/v1/chat/completions"),
    ):
        status, payload = _call(sidecar_port, method, path, b"", {})
        assert 400 <= status < 500
        _assert_sane(status, payload)


def test_malformed_http_is_a_400_from_the_protocol_layer(sidecar_port: int) -> None:
    status, _ = _call(
        sidecar_port, "POST", "/v1/completions", b"{}", {"x-fleetwarden-tenant": "\x7f"}
    )
    assert status == 400
