"""ModelDeployment events: every change asks for a reconcile.

Level-based on purpose: the reconcile compares the whole desired state with the cluster, so it does
not matter which event woke it, and Kopf stores no progress annotations on the user's objects.
Deletion needs no handler work for children (owner references let the garbage collector remove
them); the pools it used get their allocation recomputed.
"""

from __future__ import annotations

from typing import Any

import kopf

from fleetwarden.operator.fleet import ObjectRecord
from fleetwarden.operator.handlers.common import GROUP, VERSION, runtime_of


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event(
        GROUP, VERSION, "modeldeployments", id="modeldeployment-event", registry=registry
    )
    async def on_event(body: kopf.Body, type: str | None, memo: Any, **kwargs: Any) -> None:
        runtime = runtime_of(memo, kwargs)
        record = ObjectRecord.from_body(body)
        if type == "DELETED":
            runtime.model_deployment_gone(record)
        else:
            runtime.model_deployments.request(record.key)
