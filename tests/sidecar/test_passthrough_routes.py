"""The `/v1/...` passthrough: only the configured engine routes, never a way around the scheduler.

Before the fix every `/v1/...` path other than the two scheduled ones was forwarded with its
path normalised and redirects followed, so `/v1/x/../chat/completions`, `/v1/./chat/completions`,
`/v1/chat%2Fcompletions` and `/v1/chat/completions/` (which vLLM's FastAPI app redirects) were
served as completions the fair scheduler never saw, with the client's `priority` intact; and any
engine route (embeddings, LoRA loading) was open to every client. The engine here is the stub
with a recorder in front that also answers the redirects a FastAPI app answers.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from fleetwarden.common.passthrough import DEFAULT_PASSTHROUGH, PassthroughRoute, parse_passthrough
from fleetwarden.sidecar.settings import SettingsError, SidecarSettings
from fleetwarden.sim.profiles import VTC_A10G
from fleetwarden.sim.stub_engine import StubEngine
from tests.support.sidecar_stack import SidecarHandle, running_sidecar, serve

SCHEDULED = ("/v1/chat/completions", "/v1/completions")
CHAT = {
    "model": "stub-model",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 2,
    "priority": -100,
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Recorder:
    url: str = ""
    seen: list[tuple[str, str]] = field(default_factory=list)
    """(method, raw path with query) of every request but the telemetry's `/metrics`."""


@contextlib.asynccontextmanager
async def recording_engine() -> AsyncIterator[Recorder]:
    """The stub engine, recording what reaches it; it redirects `<scheduled route>/` to the
    route (FastAPI's `redirect_slashes`), `GET /v1/models/moved` to `/v1/models` and
    `POST /v1/embeddings` to `/v1/chat/completions`."""
    recorder = Recorder()
    app = StubEngine(VTC_A10G, model="stub-model", time_scale=0.05).app()

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        await request.read()
        if request.path != "/metrics":
            recorder.seen.append((request.method, request.raw_path))
        if request.path.rstrip("/") in SCHEDULED and request.path.endswith("/"):
            raise web.HTTPTemporaryRedirect(request.path.rstrip("/"))
        if request.path == "/v1/models/moved":
            raise web.HTTPTemporaryRedirect("/v1/models")
        if request.path == "/v1/embeddings":
            raise web.HTTPTemporaryRedirect("/v1/chat/completions")
        return await handler(request)

    app.middlewares.append(record)
    async with serve(app) as served:
        recorder.url = served.url
        yield recorder


async def call(
    sc: SidecarHandle, method: str, target: str, body: object = None
) -> tuple[int, dict[str, object]]:
    """`method target` sent with the target exactly as written (no client normalisation)."""
    url = URL(sc.url + target, encoded=True)
    async with aiohttp.ClientSession() as http, http.request(method, url, json=body) as r:
        return r.status, await r.json(content_type=None)


def assert_unknown_route(status: int, answer: dict[str, object]) -> None:
    assert status == 404, answer
    error = answer["error"]
    assert isinstance(error, dict)
    assert error["code"] == "unknown_route"
    assert error["type"] == "not_found_error"


@pytest.mark.parametrize(
    "target",
    [
        "/v1/chat/completions/",  # the engine would redirect it to the route, and was followed
        "/v1/completions/",
        "/v1/x/../chat/completions",
        "/v1/./chat/completions",
        "/v1/x/%2e%2e/chat/completions",
        "/v1/chat%2Fcompletions",
        "/v1/chat%2fcompletions",
        "/v1/chat%5Ccompletions",
        "/v1/chat\\completions",
        "/v1//chat/completions",
        "/v1/models/..%2Fchat%2Fcompletions",
        "/v1/models/%2E%2E/chat/completions",
    ],
)
async def test_path_variants_of_the_scheduled_routes_are_refused(target: str) -> None:
    async with recording_engine() as engine, running_sidecar(engine.url) as sc:
        seq = sc.state.dispatcher.next_seq()
        status, answer = await call(sc, "POST", target, CHAT)
        assert_unknown_route(status, answer)
        assert engine.seen == []  # nothing reached the engine
        assert sc.state.dispatcher.next_seq() == seq + 1  # nor the scheduler


async def test_an_encoded_spelling_of_a_scheduled_route_is_scheduled() -> None:
    """aiohttp's router decodes `%68` (not `%2F`): this is the route itself, so scheduled."""
    async with recording_engine() as engine, running_sidecar(engine.url) as sc:
        seq = sc.state.dispatcher.next_seq()
        status, _ = await call(sc, "POST", "/v1/c%68at/completions", CHAT)
        assert status == 200
        assert sc.state.dispatcher.next_seq() == seq + 2  # it took a place in the queue
        assert engine.seen == [("POST", "/v1/chat/completions")]


async def test_only_the_listed_engine_routes_pass_by_default() -> None:
    async with recording_engine() as engine, running_sidecar(engine.url) as sc:
        status, answer = await call(sc, "GET", "/v1/models")
        assert status == 200
        assert answer["data"][0]["id"] == "stub-model"  # type: ignore[index]
        for method, target in (
            ("POST", "/v1/embeddings"),
            ("POST", "/v1/responses"),
            ("POST", "/v1/audio/transcriptions"),
            ("POST", "/v1/score"),
            ("POST", "/v1/rerank"),
            ("POST", "/v1/load_lora_adapter"),
            ("POST", "/v1/unload_lora_adapter"),
            ("GET", "/v1/chat/completions"),
            ("DELETE", "/v1/models"),
            ("POST", "/v1/models"),
            ("GET", "/v1/models/"),
        ):
            status, answer = await call(sc, method, target, {"model": "stub-model"})
            assert_unknown_route(status, answer)
        assert engine.seen == [("GET", "/v1/models")]


async def test_the_raw_path_and_query_reach_the_engine_unchanged() -> None:
    async with recording_engine() as engine, running_sidecar(engine.url) as sc:
        target = "/v1/models/org%40x/name%20v2?a=%2F&b=1"
        status, _ = await call(sc, "GET", target)
        assert status == 404  # the stub has no such model route; its 404 is relayed
        assert engine.seen == [("GET", target)]


async def test_a_model_id_with_an_encoded_slash_passes() -> None:
    """The OpenAI SDK percent-encodes a model id's slash (`models.retrieve("org/name")`); the
    engine decodes it before routing, so it matches `GET /v1/models/**`, as it did before the
    passthrough became an allowlist."""
    async with recording_engine() as engine, running_sidecar(engine.url) as sc:
        target = "/v1/models/meta-llama%2FLlama-3-8B"
        status, _ = await call(sc, "GET", target)
        assert status == 404  # the stub serves no per-model route; its 404 is relayed
        assert engine.seen == [("GET", target)]


async def test_an_engine_redirect_is_never_followed() -> None:
    async with recording_engine() as engine, running_sidecar(engine.url) as sc:
        status, answer = await call(sc, "GET", "/v1/models/moved")
        assert status == 502, answer
        assert "redirect" in answer["error"]["message"]  # type: ignore[index]
        assert engine.seen == [("GET", "/v1/models/moved")]


async def test_configured_routes_pass_and_replace_the_default() -> None:
    routes = ("POST /v1/embeddings", "GET /v1/models/*")
    async with (
        recording_engine() as engine,
        running_sidecar(engine.url, passthrough=routes) as sc,
    ):
        # Listed, so forwarded; the engine's redirect to a completion route is not followed.
        status, _ = await call(sc, "POST", "/v1/embeddings", {**CHAT, "input": "x"})
        assert status == 502
        status, _ = await call(sc, "GET", "/v1/models/one")
        assert status == 404  # the stub's own answer
        for method, target in (("GET", "/v1/models"), ("GET", "/v1/models/org/name")):
            assert_unknown_route(*await call(sc, method, target))
        assert engine.seen == [("POST", "/v1/embeddings"), ("GET", "/v1/models/one")]
    async with recording_engine() as engine, running_sidecar(engine.url, passthrough=()) as sc:
        assert_unknown_route(*await call(sc, "GET", "/v1/models"))
        assert engine.seen == []


def test_route_patterns() -> None:
    models, model = parse_passthrough(DEFAULT_PASSTHROUGH)
    assert models.matches("GET", ["v1", "models"])
    assert not models.matches("POST", ["v1", "models"])
    assert not models.matches("GET", ["v1", "models", "x"])
    assert model.matches("GET", ["v1", "models", "org", "name"])
    assert not model.matches("GET", ["v1", "models"])
    one = PassthroughRoute.parse("POST /v1/*/embed")
    assert one.matches("POST", ["v1", "a", "embed"])
    assert not one.matches("POST", ["v1", "a", "b", "embed"])
    assert parse_passthrough(["", "  "]) == ()


@pytest.mark.parametrize(
    "entry",
    [
        "POST /v1/chat/completions",  # scheduled routes can never pass through
        "GET /v1/completions",
        "POST /v1/*",
        "POST /v1/*/completions",
        "PUT /v1/**",
        "/v1/models",  # no method
        "get /v1/models",
        "ANY /v1/models",
        "GET /v2/models",
        "GET /v1/",
        "GET /v1//models",
        "GET /v1/../models",
        "GET /v1/./models",
        "GET /v1/a%2Fb",
        "GET /v1/a\\b",
        "GET /v1/models?x=1",
        "GET /v1/models extra",
        "GET /v1/mo\tdels",
        "GET /v1/**/models",
        "GET /v1/mod*",
    ],
)
def test_bad_passthrough_settings_are_refused(entry: str) -> None:
    with pytest.raises(SettingsError):
        SidecarSettings(passthrough=(entry,))


def test_a_lone_string_is_refused() -> None:
    with pytest.raises(SettingsError):
        SidecarSettings(passthrough="GET /v1/models")  # type: ignore[arg-type]


def test_the_default_settings_are_the_secure_list() -> None:
    assert SidecarSettings().passthrough == ("GET /v1/models", "GET /v1/models/**")
