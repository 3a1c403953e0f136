"""Send a dispatched request to the engine and relay the answer to the client as it arrives.

Streamed responses are forwarded event by event, never buffered: each server-sent event is
written to the client as soon as it is complete, and each one carrying a token is charged to the
scheduler at that moment (fair policies must see service as it is delivered). The engine is
always asked for `include_usage`; its final usage chunk settles the exact prompt and output
counts and is dropped from the client's stream unless the client asked for it. An engine failure
becomes an OpenAI-style 502/504 before the first byte, or a final error event after it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_writer import StreamWriter

from fleetwarden.fairness.fluidity import FluidityTracker
from fleetwarden.fairness.request import Request
from fleetwarden.sidecar.dispatcher import Dispatcher
from fleetwarden.sidecar.errors import ApiError, error_body
from fleetwarden.sidecar.metrics import SidecarMetrics
from fleetwarden.sidecar.openai_request import ParsedCall

_DONE = b"data: [DONE]"
_MAX_ERROR_BODY = 64 * 1024
_FORWARDED_REQUEST_HEADERS = ("authorization", "accept", "user-agent", "x-request-id")
_DRAIN_ABOVE = 64 * 1024
"""Client write buffer above which the relay waits for it to drain (a slow client)."""


@dataclass
class Flight:
    """A dispatched request's life on the wire: what the metrics and settlement need."""

    request: Request
    call: ParsedCall
    tier: str
    arrival_s: float
    dispatched_s: float
    fluidity: FluidityTracker | None
    first_token_s: float | None = None
    last_token_s: float | None = None
    outcome: str = "served"
    usage: dict[str, Any] = field(default_factory=dict)


def upstream_headers(headers: Mapping[str, str]) -> dict[str, str]:
    forwarded = {k: v for k in _FORWARDED_REQUEST_HEADERS if (v := headers.get(k)) is not None}
    forwarded["content-type"] = "application/json"
    return forwarded


def _engine_failure(exc: BaseException) -> ApiError:
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return ApiError(504, "the inference engine did not answer in time", code="engine_timeout")
    return ApiError(
        502, f"the inference engine is unavailable ({exc.__class__.__name__})", code="engine_error"
    )


async def engine_error_response(upstream: aiohttp.ClientResponse) -> web.Response:
    """The engine refused the request: relay a 4xx as the engine said it, a 5xx as 502."""
    body = await upstream.content.read(_MAX_ERROR_BODY)
    if upstream.status < 500:
        return web.Response(
            status=upstream.status,
            body=body,
            content_type=upstream.content_type or "application/json",
        )
    message = "the inference engine failed"
    try:
        detail = json.loads(body).get("error", {}).get("message") or json.loads(body).get("message")
        if isinstance(detail, str):
            message = f"{message}: {detail[:500]}"
    except (ValueError, AttributeError):
        pass
    raise ApiError(502, message, code="engine_error")


def plain_tokens(data: bytes) -> int:
    """Token events in `data` when it holds only complete content events, else -1.

    The common read: no role, usage or `[DONE]` event and no incomplete tail, so it is
    forwarded as it is and its tokens are its events that start with `data:`, found by byte
    scans instead of splitting it (JSON strings cannot hold a raw newline, so `\\n\\ndata:`
    only occurs at an event boundary). Equal to `split_events` on such reads.
    """
    if (
        data.endswith(b"\n\n")
        and _DONE not in data
        and b'"role":"assistant"' not in data
        and b'"usage":{' not in data
        and b'"usage": {' not in data
    ):
        return data.startswith(b"data:") + data.count(b"\n\ndata:")
    return -1


def split_events(
    pending: bytes, client_wants_usage: bool
) -> tuple[bytes, bytes, dict[str, Any] | None, int]:
    """Complete events of `pending` to forward, the incomplete rest, a usage if seen, and the
    number of token events among them (the role-only opening event and the usage chunk are not
    tokens). The per-event path, for reads that are not only complete content events."""
    out: list[bytes] = []
    usage: dict[str, Any] | None = None
    tokens = 0
    start = 0
    while (end := pending.find(b"\n\n", start)) >= 0:
        event = pending[start : end + 2]
        start = end + 2
        if event.startswith(_DONE):
            out.append(event)
            continue
        if b'"usage":{' in event or b'"usage": {' in event:
            try:
                chunk = json.loads(event[event.index(b"{") :])
            except ValueError:
                chunk = {}
            found = chunk.get("usage") if isinstance(chunk, dict) else None
            if isinstance(found, dict):
                usage = found
            if isinstance(chunk, dict) and not chunk.get("choices"):
                if client_wants_usage:
                    out.append(event)
                continue
        if event.startswith(b"data:") and not (
            b'"role":"assistant"' in event and b'"content":""' in event
        ):
            tokens += 1
        out.append(event)
    return b"".join(out), pending[start:], usage, tokens


def _direct_writer(
    response: web.StreamResponse, writer: AbstractStreamWriter | None
) -> StreamWriter | None:
    """The response's writer, when the body after its first write may bypass it.

    Only aiohttp's own chunked, uncompressed writer: once the first write has carried the
    headers out, a body chunk is `<hex size>CRLF data CRLF` on its transport and nothing else,
    the writer's state needs only `output_size` kept, and `write_eof` still ends the body
    correctly. Anything else (HTTP/1.0, compression) keeps going through `response.write`.
    """
    if not isinstance(writer, StreamWriter) or not writer.chunked or response.compression:
        return None
    return writer


class Relay:
    """One sidecar's connection to its engine plus the settlement of every response."""

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
    ) -> None:
        self._session = session
        self._base = engine_url.rstrip("/")
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._stream_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=idle_timeout_s
        )
        self._unary_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=response_timeout_s
        )

    async def forward(
        self,
        http_request: web.Request,
        path: str,
        flight: Flight,
        response_headers: Mapping[str, str],
    ) -> web.StreamResponse:
        """Call the engine with `flight.call` and answer the client."""
        timeout = self._stream_timeout if flight.call.stream else self._unary_timeout
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
                    response.headers.update(response_headers)
                    return response
                if flight.call.stream:
                    return await self._relay_stream(
                        http_request, upstream, flight, response_headers
                    )
                return await self._relay_unary(upstream, flight, response_headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = _engine_failure(exc)
            flight.outcome = "timeout" if error.status == 504 else "engine_error"
            raise error from None

    async def _relay_unary(
        self,
        upstream: aiohttp.ClientResponse,
        flight: Flight,
        response_headers: Mapping[str, str],
    ) -> web.Response:
        body = await upstream.read()
        now = self._dispatcher.clock()
        flight.first_token_s = flight.last_token_s = now
        try:
            usage = json.loads(body).get("usage")
        except (ValueError, AttributeError):
            usage = None
        self._settle(flight, usage if isinstance(usage, dict) else None, now)
        return web.Response(
            status=200,
            body=body,
            content_type=upstream.content_type or "application/json",
            headers=response_headers,
        )

    async def _relay_stream(
        self,
        http_request: web.Request,
        upstream: aiohttp.ClientResponse,
        flight: Flight,
        response_headers: Mapping[str, str],
    ) -> web.StreamResponse:
        """Forward each read's complete events at once and charge its tokens in one sum.

        This loop runs once per read of the engine's socket (one token event or a few), so it
        is written for the interpreter: everything it calls per read is bound to a local first,
        a read of plain content events is counted with byte scans instead of being split, and
        once the headers are out the body goes to the client's transport as one HTTP chunk per
        read (`_direct_writer`), without aiohttp's two coroutine layers per write.
        """
        response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                **response_headers,
            },
        )
        direct = _direct_writer(response, await response.prepare(http_request))
        clock = self._dispatcher.clock
        charge = self._dispatcher.scheduler.on_output
        observe_gap = self._metrics.inter_token_now.observe
        on_token = flight.fluidity.on_token if flight.fluidity is not None else None
        request, wants_usage = flight.request, flight.call.client_wants_usage
        read = upstream.content.readany
        client: asyncio.WriteTransport | None = None
        """The client's transport, once the first write carried the headers out (if direct)."""
        pending = b""
        usage: dict[str, Any] | None = None
        try:
            while data := await read():
                if pending:
                    data, pending = pending + data, b""
                tokens = plain_tokens(data)
                if tokens < 0:
                    data, pending, found, tokens = split_events(data, wants_usage)
                    if found is not None:
                        usage = found
                if tokens:
                    now = clock()
                    if flight.last_token_s is None:
                        flight.first_token_s = now
                    else:
                        observe_gap(now - flight.last_token_s)
                    flight.last_token_s = now
                    if on_token is not None:
                        for _ in range(tokens):
                            on_token(now)
                    charge(request, tokens, now)
                if not data:
                    continue
                if client is None or direct is None:
                    await response.write(data)
                    client = None if direct is None else direct.transport
                    continue
                if client.is_closing():
                    raise ConnectionResetError("the client closed the connection")
                data = b"%x\r\n%b\r\n" % (len(data), data)
                client.write(data)
                direct.output_size += len(data)
                if client.get_write_buffer_size() > _DRAIN_ABOVE:
                    await direct.drain()  # waits only while the transport paused writing
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = _engine_failure(exc)
            flight.outcome = "timeout" if error.status == 504 else "engine_error"
            payload = error_body(error.status, error.message, error.code)
            await response.write(b"data: " + payload + b"\n\n")
        self._settle(flight, usage, clock())
        await response.write_eof()
        return response

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
            metrics.ttft.labels(metrics.model, metrics.region, identity_tier).observe(
                flight.first_token_s - flight.arrival_s
            )
        if flight.fluidity is not None and flight.call.stream and request.output_tokens:
            metrics.fluidity.labels(metrics.model, metrics.region, identity_tier).observe(
                flight.fluidity.index
            )
