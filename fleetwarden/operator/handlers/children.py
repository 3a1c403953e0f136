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
WATCH_SELECTOR = f"{naming.MANAGED_BY}={naming.MANAGER}"
"""Server-side label selector of every watch (and its initial list) of CHILD_KINDS."""


def configure_watching(settings: kopf.OperatorSettings) -> None:
    """Have the API server send only the operator's own objects of the child kinds.

    Without it Kopf lists and watches every Deployment, Service and ConfigMap in the cluster and
    drops all but ours client-side: memory and API load grow with everyone else's objects. The
    handlers' own label filter stays (it also requires the serving component). Nothing here needs
    an unlabelled object: a child someone strips of the label arrives as DELETED (the server's
    view of a watch with a selector), which still asks its owner for a reconcile that puts the
    label back; all other reads of children are GETs by name or selected LISTs.
    """
    for group, version, plural in CHILD_KINDS:
        settings.watching.label_selectors[group, version, plural] = WATCH_SELECTOR


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
