"""The admin API the operator talks to: apply a fairness config, inspect queues and counters.

`PUT /admin/config` takes the same JSON document the ConfigMap holds, validates it completely
(pydantic) and applies it atomically, answering with the version now in force; an invalid
document changes nothing and gets a 422 naming the bad fields, and a valid one the scheduler fails
to install (a bug) changes nothing either and gets a 500 saying so. `GET /admin/state` lists the
tenants with the most queued requests (`?limit=`, default 1,000, at most 10,000) and the counters
of those and of any tenant named with `?tenant=` (repeatable): never every tenant, since it is
built on the loop that relays tokens (`FairScheduler.snapshot`). Both routes need the bearer
token from the mounted Secret; without a configured token the admin API is disabled.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import TYPE_CHECKING

from aiohttp import web
from pydantic import ValidationError

from fleetwarden.common.capped_read import read_capped
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.scheduler import SNAPSHOT_TENANTS
from fleetwarden.sidecar.dispatcher import ConfigNotAppliedError
from fleetwarden.sidecar.errors import ApiError

if TYPE_CHECKING:
    from fleetwarden.sidecar.app import SidecarState

log = logging.getLogger(__name__)

MAX_CONFIG_BYTES = 1024 * 1024
MAX_STATE_TENANTS = 10_000
"""Most tenants one `GET /admin/state` may list or name."""


def _state(request: web.Request) -> SidecarState:
    from fleetwarden.sidecar.app import STATE

    return request.app[STATE]


def _authorise(request: web.Request) -> SidecarState:
    state = _state(request)
    expected = state.admin_token
    if expected is None:
        raise ApiError(
            403, "the admin API is disabled (no admin token configured)", code="admin_disabled"
        )
    given = request.headers.get("Authorization", "")
    scheme, _, token = given.partition(" ")
    # aiohttp decodes header bytes that are not UTF-8 as lone surrogates (surrogateescape), which
    # a plain `.encode()` refuses: encode them back to the bytes sent, so they compare unequal.
    presented = token.encode("utf-8", "surrogateescape")
    if scheme.lower() != "bearer" or not hmac.compare_digest(presented, expected.encode()):
        raise ApiError(401, "a valid admin bearer token is required", code="invalid_admin_token")
    return state


def _validation_message(error: ValidationError) -> str:
    problems = [
        f"{'.'.join(str(p) for p in item['loc']) or '(document)'}: {item['msg']}"
        for item in error.errors()[:10]
    ]
    return "invalid fairness config: " + "; ".join(problems)


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, or ApiError(413) once it is past `limit` bytes. One `content.read(n)`
    returns only what has arrived so far, not n bytes: a config sent in several TCP segments
    (any large one) was cut there and refused as invalid JSON."""
    too_large = ApiError(
        413, f"config document larger than {limit} bytes", code="request_entity_too_large"
    )
    body = await read_capped(request.content, request.content_length, limit)
    if body is None:
        raise too_large
    return body


async def put_config(request: web.Request) -> web.Response:
    state = _authorise(request)
    raw = await _read_body(request, MAX_CONFIG_BYTES)
    try:
        config = FairnessConfig.from_document(raw.decode())
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: JSON nested deeper than the parser's stack allows
        if isinstance(exc, ValidationError):
            raise ApiError(422, _validation_message(exc), code="invalid_config") from None
        raise ApiError(400, "the config document is not valid JSON", code="invalid_json") from None
    except (TypeError, AttributeError):
        raise ApiError(
            400, "the config document must be a JSON object", code="invalid_json"
        ) from None
    try:
        changed = state.dispatcher.reconfigure(config)
    except ConfigNotAppliedError as exc:
        log.error("%s", exc, exc_info=exc.__cause__)
        raise ApiError(500, str(exc), code="config_not_applied") from None
    return web.json_response({"version": state.dispatcher.scheduler.version, "changed": changed})


def _state_query(request: web.Request) -> tuple[list[str], int]:
    """The tenants named and the listing limit of a state request; ApiError(400) when bad."""
    named = request.query.getall("tenant", [])
    if len(named) > MAX_STATE_TENANTS or any(len(t) > 128 for t in named):
        raise ApiError(
            400,
            f"at most {MAX_STATE_TENANTS} tenant names of at most 128 characters",
            param="tenant",
        )
    raw = request.query.get("limit", str(SNAPSHOT_TENANTS))
    # ASCII digits only: `isdigit` alone passes "²", which `int` refuses
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6) or int(raw) > MAX_STATE_TENANTS:
        raise ApiError(
            400, f"limit must be an integer from 0 to {MAX_STATE_TENANTS}", param="limit"
        )
    return named, int(raw)


async def get_state(request: web.Request) -> web.Response:
    state = _authorise(request)
    named, limit = _state_query(request)
    dispatcher = state.dispatcher
    body = dispatcher.scheduler.snapshot(dispatcher.clock(), tenants=named, limit=limit)
    body["source"] = dispatcher.config.source
    body["servedModel"] = dispatcher.config.served_model
    native = state.relay.native if state.relay is not None else None
    # Which relay forwards streamed bodies here (`--relay`), and how many the C relay holds now.
    body["relay"] = {
        "mode": "python" if native is None else "native",
        "streams": None if native is None else native.active,
    }
    return web.Response(body=json.dumps(body), content_type="application/json")


def add_routes(app: web.Application) -> None:
    app.router.add_put("/admin/config", put_config)
    app.router.add_get("/admin/state", get_state)
