"""Events of the operator's own children: any change or deletion re-reconciles the owner.

This is how drift is corrected within seconds (someone edits a Deployment's replicas or deletes a
Service) and how Deployment readiness reaches the ModelDeployment's status. The operator's own
writes also arrive here; they cost one reconcile that finds nothing to do.
"""

from __future__ import annotations

from typing import Any

import kopf

from fleetwarden.operator import naming
from fleetwarden.operator.handlers.common import GROUP, runtime_of

CHILD_LABELS = {naming.MANAGED_BY: naming.MANAGER, naming.COMPONENT: naming.SERVING}
CHILD_KINDS = (("apps", "v1", "deployments"), ("", "v1", "services"), ("", "v1", "configmaps"))


def _owner_key(body: kopf.Body) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == "ModelDeployment" and str(ref.get("apiVersion", "")).startswith(
            GROUP
        ):
            return f"{body['metadata'].get('namespace')}/{ref.get('name')}"
    return None


def register(registry: kopf.OperatorRegistry) -> None:
    for group, version, plural in CHILD_KINDS:

        @kopf.on.event(
            group,
            version,
            plural,
            labels=CHILD_LABELS,
            id=f"child-{plural}-event",
            registry=registry,
        )
        async def on_child_event(body: kopf.Body, memo: Any, **kwargs: Any) -> None:
            owner = _owner_key(body)
            if owner is not None:
                runtime_of(memo, kwargs).model_deployments.request(owner)
