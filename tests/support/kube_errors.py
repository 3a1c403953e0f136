"""Kubernetes ``Status`` errors shaped exactly like the real API server's.

Clients (the ``kubernetes`` client, Kopf, client-go inside Helm) branch on
``code`` and ``reason`` of a ``Status`` body, and log its ``message``. If the
emulator answered with anything else, error-handling paths in the operator
would be tested against a fiction, so every error the emulator produces goes
through the constructors below, which mirror apimachinery's
``k8s.io/apimachinery/pkg/api/errors`` helpers (``NewNotFound``,
``NewAlreadyExists``, ``NewConflict``, ``NewInvalid``, ...).
"""

from __future__ import annotations

from typing import Any


def _qualified(group: str, plural: str) -> str:
    """``deployments.apps`` / ``configmaps``: how the server names a resource in messages."""
    return f"{plural}.{group}" if group else plural


class ApiError(Exception):
    """An error that the emulator answers with as a ``Status`` body and an HTTP code."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        """The ``Status`` object, field for field as kube-apiserver serialises it."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def _details(group: str, plural: str, name: str | None) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    details["kind"] = plural
    return details


def not_found(group: str, plural: str, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{_qualified(group, plural)} "{name}" not found',
        _details(group, plural, name),
    )


def resource_not_found() -> ApiError:
    """An unknown URL/resource: the real server answers with an almost empty 404 Status."""
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def already_exists(group: str, plural: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{_qualified(group, plural)} "{name}" already exists',
        _details(group, plural, name),
    )


def conflict(group: str, plural: str, name: str, why: str | None = None) -> ApiError:
    why = (
        why
        or "the object has been modified; please apply your changes to the latest version and try again"
    )
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(group, plural)} "{name}": {why}',
        _details(group, plural, name),
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def invalid(
    kind: str,
    group: str,
    name: str,
    causes: list[tuple[str, str, str]],
) -> ApiError:
    """A 422 ``Invalid``; each cause is ``(reason, field, message)`` like field.Error."""
    summary = ", ".join(f"{field}: {message}" if field else message for _, field, message in causes)
    if len(causes) > 1:
        summary = f"[{summary}]"
    details: dict[str, Any] = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = [
        {"reason": reason, "message": message, "field": field} for reason, field, message in causes
    ]
    return ApiError(
        422,
        "Invalid",
        f'{kind}.{group} "{name}" is invalid: {summary}'
        if group
        else f'{kind} "{name}" is invalid: {summary}',
        details,
    )


def patch_rejected(message: str) -> ApiError:
    """A JSON-patch that cannot be applied (failed ``test`` op, missing path): 422 like the server."""
    return ApiError(
        422,
        "Invalid",
        "the server rejected our request due to an error in our request",
        {"causes": [{"message": message}]},
    )


def unsupported_media_type(content_type: str, accepted: list[str]) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{', '.join(accepted)}",
        {"causes": [{"reason": "UnexpectedServerResponse", "message": content_type}]},
    )


def method_not_allowed(method: str) -> ApiError:
    return ApiError(
        405,
        "MethodNotAllowed",
        f"the server does not allow this method on the requested resource ({method})",
        {},
    )


def forbidden(group: str, plural: str, name: str, why: str) -> ApiError:
    return ApiError(
        403,
        "Forbidden",
        f'{_qualified(group, plural)} "{name}" is forbidden: {why}',
        _details(group, plural, name),
    )


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def internal(message: str) -> ApiError:
    return ApiError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        {"causes": [{"message": message}]},
    )


def success_status(group: str, plural: str, name: str, uid: str) -> dict[str, Any]:
    """What DELETE answers for built-ins that do not return the deleted object."""
    details: dict[str, Any] = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = plural
    details["uid"] = uid
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    }
