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


def _by_key(body: kopf.Body, **_: Any) -> dict[str, ObjectRecord]:
    """Index an object under its key (`namespace/name`, or `name` when cluster-scoped)."""
    record = ObjectRecord.from_body(body)
    return {record.key: record}


def register(registry: kopf.OperatorRegistry) -> None:
    for plural, index_id in (
        ("regionpools", POOLS_INDEX),
        ("modeldeployments", MODEL_DEPLOYMENTS_INDEX),
        ("tenantpolicies", TENANT_POLICIES_INDEX),
    ):
        kopf.index(GROUP, VERSION, plural, id=index_id, registry=registry)(_by_key)
