"""A target's `tenant_header`: validated as a header the client can send, and the one the engine
client puts the tenant in (the tier and item headers still go with it)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pydantic import ValidationError

from fleetwarden.api.enums import Tier
from fleetwarden.batch.config import TargetConfig
from fleetwarden.batch.engine import EngineClient
from fleetwarden.batch.policy import ITEM_HEADER, TENANT_HEADER, TIER_HEADER, EngineReply
from fleetwarden.batch.records import ClaimedItem, QueueKey
from tests.batch.builders import MODEL
from tests.support.sidecar_stack import serve


def _target(**changes: Any) -> dict[str, Any]:
    return {"model": MODEL, "region": "eu-west", "kind": "spot", "base_url": "http://x", **changes}


def test_the_default_is_the_sidecars_default_and_names_are_stored_lowercase() -> None:
    assert TargetConfig.model_validate(_target()).tenant_header == TENANT_HEADER
    custom = TargetConfig.model_validate(_target(tenant_header="X-Tenant-ID"))
    assert custom.tenant_header == "x-tenant-id"


@pytest.mark.parametrize(
    "bad",
    ["", "x tenant", "x-tenant:", "x-ténant", "x" * 129, "X-Fleetwarden-Tier",
     ITEM_HEADER, "authorization", "Content-Length", "host"],
)  # fmt: skip
def test_headers_that_cannot_carry_the_tenant_are_refused(bad: str) -> None:
    with pytest.raises(ValidationError, match="tenant_header"):
        TargetConfig.model_validate(_target(tenant_header=bad))


async def test_the_client_sends_the_tenant_under_the_targets_header() -> None:
    seen: list[dict[str, str]] = []

    async def complete(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({"choices": []})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    item = ClaimedItem(
        batch_id="batch_1",
        idx=0,
        custom_id="a b",
        url="/v1/chat/completions",
        body={"model": MODEL},
        tenant="eval-team",
        created_at=0.0,
        deadline=86400.0,
        attempts=1,
        token="t",
        queue=QueueKey(MODEL, "eu-west"),
    )
    async with serve(app) as served, aiohttp.ClientSession() as session:
        target = TargetConfig.model_validate(
            _target(base_url=served.url, tenant_header="x-tenant-id", api_key="k")
        )
        reply = await EngineClient(session, 5.0).send(target, item, Tier.NIW)
    assert isinstance(reply, EngineReply)
    assert reply.status == 200
    (headers,) = seen
    assert headers["x-tenant-id"] == "eval-team"
    assert TENANT_HEADER not in {name.lower() for name in headers}
    assert headers[TIER_HEADER] == "niw"
    assert headers[ITEM_HEADER] == "batch_1/a%20b"
    assert headers["Authorization"] == "Bearer k"
