"""HTTP to targets: one item, one POST; every failure becomes an `EngineFailure` value here."""

from __future__ import annotations

from typing import Protocol
from urllib.parse import quote

import aiohttp

from fleetwarden.api.enums import Tier
from fleetwarden.batch.config import TargetConfig
from fleetwarden.batch.policy import (
    ITEM_HEADER,
    TIER_HEADER,
    EngineFailure,
    EngineReply,
)
from fleetwarden.batch.records import ClaimedItem

_GONE = (
    aiohttp.ClientConnectorError,  # refused: no pod behind the address (yet, or any more)
    aiohttp.ServerDisconnectedError,  # the pod closed the connection mid-request
    aiohttp.ClientOSError,  # reset by peer: the pod or its node went away
    aiohttp.ClientPayloadError,  # the answer was cut off
)
"""Failures that mean the target went away, not that the request failed (see
`fleetwarden.batch.policy.interrupted`). Timeouts are deliberately not among them."""


class Sender(Protocol):
    """Sends one item to a target (the seam the dispatcher tests and benchmarks swap)."""

    async def send(
        self, target: TargetConfig, item: ClaimedItem, tier: Tier
    ) -> EngineReply | EngineFailure: ...


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds; the HTTP-date form is ignored (engines send seconds)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


class EngineClient:
    """Posts items to a target's OpenAI-compatible server (usually its fleetwarden sidecar)."""

    def __init__(self, session: aiohttp.ClientSession, timeout_s: float) -> None:
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def send(
        self, target: TargetConfig, item: ClaimedItem, tier: Tier
    ) -> EngineReply | EngineFailure:
        headers = {
            TIER_HEADER: tier.value,
            # The header the target's sidecar trusts, else it counts the item as `default`.
            target.tenant_header: item.tenant,
            ITEM_HEADER: f"{item.batch_id}/{quote(item.custom_id, safe='')}",
        }
        if target.api_key:
            headers["Authorization"] = f"Bearer {target.api_key}"
        url = target.base_url.rstrip("/") + item.url
        try:
            async with self._session.post(
                url, json=item.body, headers=headers, timeout=self._timeout
            ) as response:
                body = await response.read()
                return EngineReply(
                    status=response.status,
                    body=body,
                    request_id=response.headers.get("x-request-id")
                    or f"{item.batch_id}-{item.idx}-{item.attempts}",
                    retry_after_s=_retry_after(response.headers.get("Retry-After")),
                )
        except _GONE as exc:
            return EngineFailure(
                f"{type(exc).__name__}: {exc}".rstrip(": "),
                interrupted=True,
                # ClientConnectorError subclasses ClientOSError: refused is never mid-request
                mid_request=not isinstance(exc, aiohttp.ClientConnectorError),
            )
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:  # ValueError: bad URL
            return EngineFailure(f"{type(exc).__name__}: {exc}".rstrip(": "))
