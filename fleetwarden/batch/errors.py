"""API errors, rendered as OpenAI error JSON: `{"error": {message, type, param, code}}`.

Domain errors become an `ApiError` once, in the handlers; the middleware renders it. Every 4xx
the service sends (including aiohttp's own 404 and 405) has this shape, so the openai client
raises its usual typed exceptions.
"""

from __future__ import annotations

from typing import Any

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "insufficient_quota",
}


def error_body(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """The OpenAI error object for an HTTP status."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class ApiError(Exception):
    """A request the API refuses, with its HTTP status."""

    def __init__(
        self, status: int, message: str, code: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.status, str(self), self.code, self.param)
