"""OpenAI-style error responses: every refusal a client sees has the shape its SDK expects.

The official clients map the HTTP status to an exception class and read `error.message`, so the
body is always `{"error": {"message", "type", "param", "code"}}` and never an HTML page or a
traceback, whatever went wrong.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from aiohttp import web

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    499: "client_closed_request",
    500: "server_error",
    502: "engine_error",
    503: "service_unavailable",
    504: "engine_timeout",
}


class ApiError(Exception):
    """An error to answer with; raised anywhere below a handler, rendered by the middleware."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after_s = retry_after_s


def error_body(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> bytes:
    """The JSON bytes of an OpenAI error object."""
    error = {
        "message": message,
        "type": _TYPES.get(status, "api_error"),
        "param": param,
        "code": code,
    }
    return json.dumps({"error": error}).encode()


def retry_after_header(seconds: float) -> str:
    """Retry-After is whole seconds (RFC 9110); round up so a client never retries too early."""
    if not math.isfinite(seconds):
        seconds = 60.0
    return str(max(1, math.ceil(seconds)))


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    retry_after_s: float | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """An aiohttp response carrying an OpenAI error body."""
    extra = dict(headers or {})
    if retry_after_s is not None:
        extra["Retry-After"] = retry_after_header(retry_after_s)
    return web.Response(
        status=status,
        body=error_body(status, message, code, param),
        content_type="application/json",
        headers=extra,
    )


def from_api_error(error: ApiError) -> web.Response:
    return error_response(
        error.status,
        error.message,
        code=error.code,
        param=error.param,
        retry_after_s=error.retry_after_s,
    )
