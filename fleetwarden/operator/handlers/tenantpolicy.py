"""TenantPolicy events: recompute the policy's status, and re-render its namespace's configs.

Any TenantPolicy change can move which policy applies to which ModelDeployment (selectors, ages,
deletions), so every ModelDeployment in the namespace is re-reconciled when a spec changes.
"""

from __future__ import annotations

from typing import Any

import kopf

from fleetwarden.operator.fleet import ObjectRecord
from fleetwarden.operator.handlers.common import GROUP, VERSION, observe, runtime_of

KIND = "tenantpolicy"


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event(GROUP, VERSION, "tenantpolicies", id="tenantpolicy-event", registry=registry)
    async def on_event(body: kopf.Body, type: str | None, memo: Any, **kwargs: Any) -> None:
        runtime = runtime_of(memo, kwargs)
        record = ObjectRecord.from_body(body)
        changed = observe(runtime, KIND, record, type, runtime.policies)
        if changed:
            for md in runtime.view().model_deployments_in(record.namespace):
                runtime.model_deployments.request(md.key)
