"""The sidecar's aiohttp application: OpenAI routes in front of the engine, admin, health, metrics.

Handlers are thin: validate and identify the caller (`openai_request`, `identity`), offer the
request to the fair scheduler (`dispatcher`), wait for its turn, and relay the engine's answer
(`relay`). Every error anywhere becomes an OpenAI-style JSON error via one middleware, so a bad
request, an engine failure or a bug gives the client a clear status and never a hung connection.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import unquote

import aiohttp
from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from yarl import URL

from fleetwarden.common.passthrough import SCHEDULED_ROUTES, PassthroughRoute, parse_passthrough
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.fluidity import FluidityTracker
from fleetwarden.fairness.idle import TenantRetention
from fleetwarden.fairness.request import Request
from fleetwarden.fairness.scheduler import Admission, QueueLimits
from fleetwarden.sidecar import admin
from fleetwarden.sidecar.dispatcher import Dispatcher
from fleetwarden.sidecar.errors import ApiError, error_response, from_api_error
from fleetwarden.sidecar.flight import Flight
from fleetwarden.sidecar.identity import (
    INTERACTION_HEADER,
    MIN_INTERACTION_SECRET_BYTES,
    InteractionTokens,
    resolve_identity,
    scheduling_deadline_ms,
    scheduling_tier,
)
from fleetwarden.sidecar.metrics import SidecarMetrics
from fleetwarden.sidecar.native_relay import native_relay_for
from fleetwarden.sidecar.openai_request import CallKind, parse_call
from fleetwarden.sidecar.relay import Relay, engine_error_response, upstream_headers
from fleetwarden.sidecar.secret_watch import SecretWatcher, WatchedSecret
from fleetwarden.sidecar.settings import SidecarSettings
from fleetwarden.sidecar.telemetry import TelemetryPoller

log = logging.getLogger(__name__)


@dataclass
class SidecarState:
    settings: SidecarSettings
    dispatcher: Dispatcher
    metrics: SidecarMetrics
    tokens: InteractionTokens
    session: aiohttp.ClientSession | None = None
    relay: Relay | None = None
    telemetry: TelemetryPoller | None = None
    admin_token: str | None = None
    """The admin bearer token in force: the settings' value until the mounted Secret changes."""
    secret_watch: SecretWatcher | None = None
    passthrough: tuple[PassthroughRoute, ...] = ()
    """The engine routes clients may call unscheduled (`settings.passthrough`, parsed)."""

    def watch_secrets(self) -> SecretWatcher:
        """A watcher applying changes of the mounted secret files to this sidecar."""

        def set_admin_token(value: str) -> None:
            self.admin_token = value

        def set_interaction_secret(value: str) -> None:
            self.tokens.rekey(value.encode())

        settings = self.settings
        watched = []
        if settings.admin_token_file is not None:
            watched.append(
                WatchedSecret(
                    settings.admin_token_file,
                    set_admin_token,
                    startup_stamps=settings.secret_stamps,
                )
            )
        if settings.interaction_secret_file is not None:
            watched.append(
                WatchedSecret(
                    settings.interaction_secret_file,
                    set_interaction_secret,
                    min_length=MIN_INTERACTION_SECRET_BYTES,
                    startup_stamps=settings.secret_stamps,
                )
            )
        return SecretWatcher(watched, interval_s=settings.secret_poll_s)


STATE = web.AppKey("fleetwarden_sidecar", SidecarState)


@web.middleware
async def openai_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every failure as an OpenAI error body: ApiError, aiohttp's HTTP errors, and bugs (500)."""
    try:
        return await handler(request)
    except ApiError as error:
        return from_api_error(error)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.reason
        if exc.status == 413:
            message = (
                f"request body too large (limit {request.app[STATE].settings.max_body_bytes} bytes)"
            )
        return error_response(exc.status, message, code=exc.reason.lower().replace(" ", "_"))
    except ConnectionResetError:
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(
            500, "internal error in the fleetwarden sidecar", code="internal_error"
        )


def _refusal_error(admission: Admission, tenant: str, prompt_tokens: int) -> ApiError:
    """A refused request's answer: 429 with Retry-After when a retry can pass, else a 400 that
    tells the client to change the request (a retry loop on a 429 would never end)."""
    refusal = admission.refusal
    if refusal is not None and not refusal.retryable:
        return ApiError(
            400,
            f"request refused for tenant {tenant!r}: its {prompt_tokens} prompt tokens exceed"
            f" the whole {admission.detail} limit ({admission.limit} tokens per minute), so it"
            " can never be admitted; send a shorter prompt",
            code=refusal.value,
            param=admission.detail,
        )
    return ApiError(
        429,
        f"request refused for tenant {tenant!r}: {admission.detail}",
        code=refusal.value if refusal is not None else "throttled",
        retry_after_s=admission.retry_after_s,
    )


async def _completions(http_request: web.Request, kind: CallKind, path: str) -> web.StreamResponse:
    state = http_request.app[STATE]
    settings, dispatcher = state.settings, state.dispatcher
    raw = await http_request.read()
    call = parse_call(
        raw,
        kind,
        default_max_tokens=settings.default_max_tokens,
        forward_priority=settings.forward_priority,
    )
    config = dispatcher.config
    identity = resolve_identity(
        http_request.headers,
        call.user,
        tenant_header=config.tenant_header,
        tokens=state.tokens,
        now_unix=time.time(),
    )
    configured = config.tenants.get(identity.tenant, config.defaults).tier
    tier = scheduling_tier(identity.tier, configured)
    targets = config.tiers.get(tier)
    now = dispatcher.clock()
    deadline_ms = scheduling_deadline_ms(
        identity.deadline_ms, None if targets is None else targets.ttft_s
    )
    deadline = None if deadline_ms is None else now + deadline_ms / 1000.0
    request = Request(
        seq=dispatcher.next_seq(),
        tenant=identity.tenant,
        arrival_s=now,
        input_tokens=call.prompt_tokens,
        max_output_tokens=call.max_tokens,
        system_tokens=call.system_tokens,
        app=identity.app,
        interaction=identity.interaction,
        stage=identity.stage,
        continuation=identity.continuation,
        tier=tier,
        deadline_s=deadline,
    )
    metrics = state.metrics
    admission = dispatcher.offer(request)
    if not admission.queued:
        error = _refusal_error(admission, identity.tenant, request.input_tokens)
        outcome = "throttled" if error.status == 429 else "invalid"
        metrics.count_request(identity.tenant, identity.app, tier.value, outcome)
        raise error

    def headers() -> dict[str, str]:
        """Made once the engine has the request (`Relay.forward`): signing costs."""
        token = state.tokens.issue(identity.tenant, identity.interaction, time.time())
        return {INTERACTION_HEADER: token}

    flight = Flight(
        request=request,
        call=call,
        tier=tier.value,
        arrival_s=now,
        dispatched_s=now,
        fluidity=None if targets is None else FluidityTracker(targets.ttft_s, targets.tbt_s, now),
    )
    try:
        if not await dispatcher.wait_turn(request, settings.max_queue_wait_s):
            flight.outcome = "throttled"
            raise ApiError(
                429,
                f"request waited {settings.max_queue_wait_s:g} s in the queue without being served",
                code="queue_timeout",
                retry_after_s=settings.max_queue_wait_s / 10,
            )
        flight.dispatched_s = dispatcher.clock()
        metrics.observe_queue_wait(tier.value, flight.dispatched_s - now)
        assert state.relay is not None
        return await state.relay.forward(http_request, path, flight, headers)
    except (asyncio.CancelledError, ConnectionResetError):
        flight.outcome = "cancelled"  # the client went away; the finally settles its charges
        raise
    except Exception:
        if flight.outcome == "served":
            flight.outcome = "engine_error"
        raise
    finally:
        metrics.count_request(identity.tenant, identity.app, tier.value, flight.outcome)
        dispatcher.release(request)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _completions(request, CallKind.CHAT, "/v1/chat/completions")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _completions(request, CallKind.COMPLETION, "/v1/completions")


def passthrough_segments(raw_path: str) -> list[str] | None:
    """The segments of a still-encoded request path as the engine will route it (decoded, then
    split: a server such as uvicorn decodes `%2F` before routing), or None when that path has
    dot segments, back slashes or empty segments. Checking the decoded path is what stops
    `/v1/chat%2Fcompletions` or `/v1/x/%2e%2e/chat/completions` reaching a completion route
    unscheduled, and what lets `GET /v1/models/org%2Fname` (the OpenAI SDK's spelling of a
    model id with a slash) match `GET /v1/models/**`."""
    decoded = unquote(raw_path)
    if "\\" in raw_path or "\\" in decoded:
        return None
    segments = decoded.split("/")[1:]
    if any(not text or text in (".", "..") for text in segments):
        return None
    return segments


def _passthrough_allowed(state: SidecarState, method: str, raw_path: str) -> bool:
    segments = passthrough_segments(raw_path)
    if segments is None or "/" + "/".join(segments) in SCHEDULED_ROUTES:
        return False
    return any(route.matches(method, segments) for route in state.passthrough)


async def passthrough(request: web.Request) -> web.StreamResponse:
    """The configured engine routes (`GET /v1/models` by default) go through unscheduled; any
    other /v1 route is a 404. The path is forwarded as the client encoded it (the route was
    matched on exactly that) and an engine redirect is never followed: followed, a redirect to
    a completion route would be served unscheduled."""
    state = request.app[STATE]
    assert state.session is not None
    target = request.rel_url
    if not _passthrough_allowed(state, request.method, target.raw_path):
        raise ApiError(
            404,
            "unknown route: this sidecar serves POST /v1/chat/completions, POST /v1/completions"
            " and the engine routes its passthrough setting lists",
            code="unknown_route",
        )
    url = URL(state.settings.engine_url.rstrip("/") + target.raw_path_qs, encoded=True)
    headers = upstream_headers(request.headers, request.headers.get("Content-Type"))
    body = await request.read()
    timeout = aiohttp.ClientTimeout(
        total=state.settings.engine_response_timeout_s,
        sock_connect=state.settings.engine_connect_timeout_s,
    )
    try:
        async with state.session.request(
            request.method,
            url,
            data=body or None,
            headers=headers,
            timeout=timeout,
            allow_redirects=False,
        ) as upstream:
            if upstream.status >= 500:
                return await engine_error_response(upstream)
            if 300 <= upstream.status < 400 and upstream.status != 304:
                raise ApiError(
                    502,
                    f"the inference engine answered a redirect (HTTP {upstream.status}),"
                    " which the sidecar does not follow",
                    code="engine_error",
                )
            payload = await upstream.read()
            if upstream.status >= 400 and upstream.content_type != "application/json":
                message = payload[:300].decode("utf-8", "replace").strip() or upstream.reason
                return error_response(upstream.status, f"engine: {message}", code="engine_refused")
            return web.Response(
                status=upstream.status,
                body=payload,
                headers={"Content-Type": upstream.headers.get("Content-Type", "application/json")},
            )
    except (aiohttp.ClientError, TimeoutError) as exc:
        status = 504 if isinstance(exc, TimeoutError) else 502
        raise ApiError(status, "the inference engine is unavailable", code="engine_error") from None


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready when the engine answered its metrics recently: only then can requests be served."""
    state = request.app[STATE]
    poller = state.telemetry
    max_age = state.dispatcher.config.gate.telemetry_max_age_s
    if poller is not None and poller.healthy(max_age):
        return web.json_response(
            {"status": "ready", "configVersion": state.dispatcher.scheduler.version}
        )
    reason = poller.last_error if poller is not None else "not started"
    return error_response(503, f"engine not ready: {reason}", code="engine_not_ready")


async def metrics_route(request: web.Request) -> web.StreamResponse:
    """The exposition, written a slice at a time with a turn of the loop between slices: with
    thousands of tenant series, formatting it at once held every stream back (89 ms measured)."""
    state = request.app[STATE]
    response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})
    await response.prepare(request)
    try:
        for piece in state.metrics.exposition_slices():
            await response.write(piece)
            await asyncio.sleep(0)
        await response.write_eof()
    except ConnectionResetError:
        # The scraper left mid-scrape (its timeout): nobody to answer and nothing to log. Drop
        # the connection rather than end the body, so what was sent cannot pass for a whole scrape.
        if request.transport is not None:
            request.transport.abort()
    return response


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    settings = state.settings
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    # Never decompressed (the relay passes raw bytes), so never asked for compressed either:
    # aiohttp's client would ask for gzip itself, and prometheus_client's /metrics (vLLM's)
    # gzips when asked, which left the telemetry poller with bytes it could not read.
    state.session = aiohttp.ClientSession(
        connector=connector, auto_decompress=False, headers={"Accept-Encoding": "identity"}
    )
    state.relay = Relay(
        state.session,
        settings.engine_url,
        state.dispatcher,
        state.metrics,
        connect_timeout_s=settings.engine_connect_timeout_s,
        response_timeout_s=settings.engine_response_timeout_s,
        idle_timeout_s=settings.engine_idle_timeout_s,
        native=native_relay_for(
            settings.relay,
            settings.engine_url,
            state.dispatcher.scheduler.on_output,
            state.metrics.inter_token_now.observe,
            state.dispatcher.clock,
            nice=settings.relay_nice,
        ),
    )
    state.telemetry = TelemetryPoller(
        state.session,
        settings.engine_url,
        state.dispatcher,
        interval_s=settings.telemetry_interval_s,
        timeout_s=settings.telemetry_timeout_s,
    )
    await state.telemetry.poll_once()
    state.telemetry.start()
    state.secret_watch = state.watch_secrets()
    state.secret_watch.start()
    yield
    await state.secret_watch.stop()
    await state.telemetry.stop()
    state.relay.close()
    await state.session.close()


def build_app(settings: SidecarSettings, config: FairnessConfig) -> web.Application:
    """The sidecar application for `settings`, starting with `config`."""
    metrics = SidecarMetrics(
        config.served_model or settings.served_model,
        settings.region,
        max_tenant_labels=settings.max_tenant_labels,
        max_app_labels=settings.max_app_labels,
    )
    dispatcher = Dispatcher(
        config,
        metrics,
        queue_limits=QueueLimits(per_tenant=settings.queue_per_tenant, total=settings.queue_total),
        retention=TenantRetention(
            forget_after_s=settings.forget_idle_tenants_after_s,
            max_idle=settings.max_idle_tenants,
        ),
    )
    secret = settings.interaction_secret or secrets.token_bytes(32)
    state = SidecarState(
        settings,
        dispatcher,
        metrics,
        InteractionTokens(secret, settings.interaction_ttl_s),
        admin_token=settings.admin_token,
        passthrough=parse_passthrough(settings.passthrough),
    )
    app = web.Application(middlewares=[openai_errors], client_max_size=settings.max_body_bytes)
    app[STATE] = state
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_route)
    admin.add_routes(app)
    app.router.add_route("*", "/v1/{tail:.*}", passthrough)
    app.cleanup_ctx.append(_lifecycle)
    return app


__all__ = ["STATE", "SidecarState", "build_app", "upstream_headers"]
