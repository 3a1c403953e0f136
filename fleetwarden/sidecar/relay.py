"""Send a dispatched request to the engine and relay the answer to the client as it arrives.

Streamed responses are forwarded as they arrive, never buffered. After the response head, the
body goes to the C relay (`native_relay`: the engine's socket to the client's in C, tokens
charged every 2 ms) where it is built and the sockets allow it, else to `stream.StreamRelay`,
which runs in the engine socket's read callback (`engine_pool.EnginePool`, a keep-alive HTTP/1.1
client on an asyncio Protocol), forwards every complete server-sent event of a read in one write
to the client's transport, and charges the scheduler for its tokens at that moment. Either way
fair policies see service as it is delivered. Non-streaming calls go through aiohttp's client.
The engine is always asked for `include_usage`; its final usage chunk settles the exact prompt
and output counts and is dropped from the client's stream unless the client asked for it. An engine failure
becomes an OpenAI-style 502/504 before the first byte, or a final error event after it; a client
that leaves aborts the engine connection, which is how the engine learns to stop generating.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_writer import StreamWriter

from fleetwarden.sidecar.dispatcher import Dispatcher
from fleetwarden.sidecar.engine_pool import EnginePool
from fleetwarden.sidecar.errors import ApiError, error_body
from fleetwarden.sidecar.flight import Flight
from fleetwarden.sidecar.metrics import SidecarMetrics
from fleetwarden.sidecar.native_relay import NativeRelay, NativeStream
from fleetwarden.sidecar.stream import NotAnEventStreamError, StreamRelay
from fleetwarden.sidecar.upstream import Collect, EngineConnection

log = logging.getLogger(__name__)

_MAX_ERROR_BODY = 64 * 1024
_FORWARDED_REQUEST_HEADERS = ("authorization", "accept", "user-agent", "x-request-id")


def upstream_headers(
    headers: Mapping[str, str], content_type: str | None = "application/json"
) -> dict[str, str]:
    """The client headers an engine call carries: a short allowlist (no cookies, no identity
    headers the engine has no use for), and `identity` encoding. The engine session does not
    decompress (the relay handles raw chunks), while aiohttp's client would otherwise ask for
    gzip itself: a compressing engine's bytes would reach a client without their
    Content-Encoding, or fail a non-streamed completion's JSON parse."""
    forwarded = {k: v for k in _FORWARDED_REQUEST_HEADERS if (v := headers.get(k)) is not None}
    forwarded["accept-encoding"] = "identity"
    if content_type is not None:
        forwarded["content-type"] = content_type
    return forwarded


def _engine_failure(exc: BaseException) -> ApiError:
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return ApiError(504, "the inference engine did not answer in time", code="engine_timeout")
    if isinstance(exc, NotAnEventStreamError):
        return ApiError(502, str(exc), code="engine_error")
    return ApiError(
        502, f"the inference engine is unavailable ({exc.__class__.__name__})", code="engine_error"
    )


async def engine_error_response(upstream: aiohttp.ClientResponse) -> web.Response:
    """`error_from_body` for a response of aiohttp's client."""
    body = await upstream.content.read(_MAX_ERROR_BODY)
    return error_from_body(upstream.status, body, upstream.content_type)


def error_from_body(status: int, body: bytes, content_type: str | None) -> web.Response:
    """The engine refused the request: relay a 4xx as the engine said it, a 5xx as 502."""
    if status < 500:
        return web.Response(
            status=status, body=body, content_type=content_type or "application/json"
        )
    message = "the inference engine failed"
    try:
        detail = json.loads(body).get("error", {}).get("message") or json.loads(body).get("message")
        if isinstance(detail, str):
            message = f"{message}: {detail[:500]}"
    except (ValueError, AttributeError, RecursionError):
        pass
    raise ApiError(502, message, code="engine_error")


def _direct_writer(
    response: web.StreamResponse, writer: AbstractStreamWriter | None
) -> StreamWriter | None:
    """The response's writer, when the body may bypass it and go to its transport.

    Only aiohttp's own uncompressed writer, whose `prepare` sent the headers already (a
    `StreamResponse` does): a body chunk is then `<hex size>CRLF data CRLF` on the transport
    (the data alone for an HTTP/1.0 client), the writer's state needs only `output_size` kept,
    and `write_eof` still ends the body correctly.
    """
    if not isinstance(writer, StreamWriter) or response.compression or writer.transport is None:
        return None
    return writer


class Relay:
    """One sidecar's connections to its engine plus the settlement of every response."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        engine_url: str,
        dispatcher: Dispatcher,
        metrics: SidecarMetrics,
        *,
        connect_timeout_s: float,
        response_timeout_s: float,
        idle_timeout_s: float,
        native: NativeRelay | None = None,
    ) -> None:
        self._session = session
        self._native = native
        """The C relay for streamed bodies; None: the Python relay (`StreamRelay`) only."""
        self._pool = EnginePool(engine_url, connect_timeout_s=connect_timeout_s)
        self._idle_timeout_s = idle_timeout_s
        self._base = engine_url.rstrip("/")
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._unary_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=response_timeout_s
        )

    @property
    def native(self) -> NativeRelay | None:
        """The C relay, if this sidecar uses it."""
        return self._native

    def close(self) -> None:
        if self._native is not None:
            self._native.close()
        self._pool.close()

    async def forward(
        self,
        http_request: web.Request,
        path: str,
        flight: Flight,
        response_headers: Callable[[], Mapping[str, str]],
    ) -> web.StreamResponse:
        """Call the engine with `flight.call` and answer the client. `response_headers` makes the
        headers the sidecar adds to the engine's answer: called once the engine answered, so that
        what it costs (an interaction token is a signature) is not paid before the engine has
        the request."""
        if flight.call.stream:
            return await self._forward_stream(http_request, path, flight, response_headers)
        timeout = self._unary_timeout
        try:
            async with self._session.post(
                self._base + path,
                data=flight.call.upstream_body,
                headers=upstream_headers(http_request.headers),
                timeout=timeout,
            ) as upstream:
                if upstream.status != 200:
                    flight.outcome = "engine_error" if upstream.status >= 500 else "invalid"
                    response = await engine_error_response(upstream)
                    response.headers.update(response_headers())
                    return response
                return await self._relay_unary(upstream, flight, response_headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = _engine_failure(exc)
            flight.outcome = "timeout" if error.status == 504 else "engine_error"
            raise error from None

    async def _relay_unary(
        self,
        upstream: aiohttp.ClientResponse,
        flight: Flight,
        response_headers: Callable[[], Mapping[str, str]],
    ) -> web.Response:
        body = await upstream.read()
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
            answer = None
        if not isinstance(answer, dict):
            # A completion is a JSON object; anything else (a proxy's HTML page, a crash dump)
            # is the engine failing, not an answer to pass on as a 200.
            flight.outcome = "engine_error"
            raise ApiError(
                502,
                "the inference engine answered with a body that is not JSON",
                code="engine_error",
            )
        now = self._dispatcher.clock()
        flight.first_token_s = flight.last_token_s = now
        usage = answer.get("usage")
        self._settle(flight, usage if isinstance(usage, dict) else None, now)
        return web.Response(
            status=200,
            body=body,
            content_type=upstream.content_type or "application/json",
            headers=response_headers(),
        )

    async def _forward_stream(
        self,
        http_request: web.Request,
        path: str,
        flight: Flight,
        response_headers: Callable[[], Mapping[str, str]],
    ) -> web.StreamResponse:
        """A streamed call on one of the pool's connections, given back (or aborted) at the end."""
        timeout_s = self._idle_timeout_s
        connection: EngineConnection | None = None
        try:
            try:
                connection, status, headers = await self._pool.request(
                    "POST",
                    path,
                    upstream_headers(http_request.headers),
                    flight.call.upstream_body,
                    timeout_s,
                    hold_body=self._native is not None,
                )
                if status != 200:
                    flight.outcome = "engine_error" if status >= 500 else "invalid"
                    sink = Collect(_MAX_ERROR_BODY)
                    connection.attach(sink, timeout_s)
                    body = await sink.done
                    value = headers.get("content-type")
                    content_type = value.split(";", 1)[0].strip() if value else None
                    response = error_from_body(status, body, content_type)
                    response.headers.update(response_headers())
                    return response
            except (OSError, TimeoutError) as exc:
                error = _engine_failure(exc)
                flight.outcome = "timeout" if error.status == 504 else "engine_error"
                raise error from None
            return await self._relay_stream(http_request, connection, flight, response_headers)
        finally:
            if connection is not None:
                self._pool.release(connection)  # aborted unless its response ended cleanly

    async def _relay_stream(
        self,
        http_request: web.Request,
        connection: EngineConnection,
        flight: Flight,
        response_headers: Callable[[], Mapping[str, str]],
    ) -> web.StreamResponse:
        """Send the head, then let `StreamRelay` forward the body from the engine's callbacks."""
        response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                **response_headers(),
            },
        )
        writer = _direct_writer(response, await response.prepare(http_request))
        if writer is None or writer.transport is None or connection.transport is None:
            raise ConnectionResetError("the client or the engine left before the stream started")
        relay: StreamRelay | NativeStream | None = self._hand_off(connection, writer, flight)
        if relay is None:
            if connection.held_body is not None:
                connection.decode_held()
            relay = StreamRelay(
                flight,
                self._dispatcher,
                self._metrics,
                writer.transport,
                writer,
                writer.chunked,
                connection,  # paused through the connection: its idle timeout pauses with it
            )
            connection.attach(relay, self._idle_timeout_s)
        try:
            try:
                await relay.done
            finally:
                if isinstance(relay, NativeStream):
                    # cancelled meanwhile: the C relay lets go of the sockets before they close
                    if self._native is not None:
                        self._native.cancel(relay, ConnectionResetError("request cancelled"))
                    connection.end_hand_off(relay.handle.clean_end)
            if relay.client_gone:
                raise ConnectionResetError("the client closed the connection")
            if relay.error is not None:
                error = _engine_failure(relay.error)
                flight.outcome = "timeout" if error.status == 504 else "engine_error"
                relay.write_error(error_body(error.status, error.message, error.code))
        finally:
            # On every exit, a client that left (reset or cancelled) too: the tokens relayed so
            # far were charged as they went out and must be in `fleetwarden_tokens_total`,
            # which the autoscaler reads. This is the stream's one settlement.
            self._settle(flight, relay.usage, self._dispatcher.clock())
        await response.write_eof()
        return response

    def _hand_off(
        self, connection: EngineConnection, writer: StreamWriter, flight: Flight
    ) -> NativeStream | None:
        """The body to the C relay, if its bytes were held for it and both sockets are free:
        nothing buffered in either transport, no TLS between the client and the sidecar."""
        native, client, engine = self._native, writer.transport, connection.transport
        if native is None or connection.held_body is None or client is None or engine is None:
            return None
        if client.get_write_buffer_size() or engine.get_write_buffer_size():
            return None
        if client.get_extra_info("sslcontext") is not None:
            return None
        client_socket = client.get_extra_info("socket")
        engine_socket = engine.get_extra_info("socket")
        if client_socket is None or engine_socket is None:
            return None
        try:
            stream = native.start(
                engine_socket.fileno(),
                client_socket.fileno(),
                connection.held_body,
                flight,
                client,
                writer,
                writer.chunked,
                self._idle_timeout_s,
            )
        except OSError as exc:  # out of descriptors: this stream is relayed in Python
            log.warning("the C relay could not take a stream (%s); relaying it in Python", exc)
            return None
        connection.take_held()
        return stream

    def _settle(self, flight: Flight, usage: dict[str, Any] | None, now: float) -> None:
        """Exact counts from the engine's usage replace the estimates charged so far."""
        scheduler = self._dispatcher.scheduler
        request = flight.request
        if usage is not None:
            flight.usage = usage
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int) and prompt >= 0:
                scheduler.reconcile_input(request, prompt, now)
            if isinstance(completion, int) and completion >= 0:
                scheduler.reconcile_output(request, completion, now)
        metrics, identity_tier = self._metrics, flight.tier
        tenant, app = request.tenant, request.app
        metrics.count_tokens(tenant, app, identity_tier, "input", request.input_tokens)
        metrics.count_tokens(tenant, app, identity_tier, "output", request.output_tokens)
        if flight.first_token_s is not None:
            metrics.observe_ttft(identity_tier, flight.first_token_s - flight.arrival_s)
        if flight.fluidity is not None and flight.call.stream and request.output_tokens:
            metrics.observe_fluidity(identity_tier, flight.fluidity.index)


__all__ = ["Relay", "engine_error_response", "error_from_body", "upstream_headers"]
