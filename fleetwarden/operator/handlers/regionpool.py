"""RegionPool events: recompute the pool's status, and re-reconcile its users when its spec changed.

A pool's node selector and tolerations are copied into serving pods, so a spec change must reach
every ModelDeployment that uses the pool; a status-only change (our own write) must not.
"""

from __future__ import annotations

from typing import Any

import kopf

from fleetwarden.operator.fleet import ObjectRecord
from fleetwarden.operator.handlers.common import GROUP, VERSION, observe, runtime_of

KIND = "regionpool"


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event(GROUP, VERSION, "regionpools", id="regionpool-event", registry=registry)
    async def on_event(body: kopf.Body, type: str | None, memo: Any, **kwargs: Any) -> None:
        runtime = runtime_of(memo, kwargs)
        record = ObjectRecord.from_body(body)
        changed = observe(runtime, KIND, record, type, runtime.pools)
        if changed:  # its users from the pool-users index: no scan of the fleet per event
            for key in runtime.pool_users(record.name):
                runtime.model_deployments.request(key)
