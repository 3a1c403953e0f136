"""Kopf indices of the three kinds: the in-memory fleet every reconcile reads.

Kopf fills all indices from a full list before it calls any handler, so the first reconcile after
a restart already sees every pool and policy; nothing is judged missing just because its watch
stream started later.
"""

from __future__ import annotations

from typing import Any

import kopf

from fleetwarden.operator.fleet import ObjectRecord
from fleetwarden.operator.handlers.common import GROUP, VERSION
from fleetwarden.operator.runtime import (
    MODEL_DEPLOYMENTS_INDEX,
    POOLS_INDEX,
    TENANT_POLICIES_INDEX,
)


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.index(GROUP, VERSION, "regionpools", id=POOLS_INDEX, registry=registry)
    def index_pools(body: kopf.Body, **_: Any) -> dict[str, ObjectRecord]:
        record = ObjectRecord.from_body(body)
        return {record.key: record}

    @kopf.index(GROUP, VERSION, "modeldeployments", id=MODEL_DEPLOYMENTS_INDEX, registry=registry)
    def index_model_deployments(body: kopf.Body, **_: Any) -> dict[str, ObjectRecord]:
        record = ObjectRecord.from_body(body)
        return {record.key: record}

    @kopf.index(GROUP, VERSION, "tenantpolicies", id=TENANT_POLICIES_INDEX, registry=registry)
    def index_tenant_policies(body: kopf.Body, **_: Any) -> dict[str, ObjectRecord]:
        record = ObjectRecord.from_body(body)
        return {record.key: record}
