"""Kopf indices of the three kinds: the in-memory fleet every reconcile reads.

Kopf fills all indices from a full list before it calls any handler, so the first reconcile after
a restart already sees every pool and policy; nothing is judged missing just because its watch
stream started later. Besides the records, ModelDeployments are indexed by the pools they name
(`pool_index.pool_user_entries`): Kopf updates all indices of an object in one step, so at any
point between events that index lists exactly the users the records name.
"""

from __future__ import annotations

from typing import Any

import kopf

from fleetwarden.operator.fleet import ObjectRecord
from fleetwarden.operator.handlers.common import GROUP, VERSION
from fleetwarden.operator.pool_index import pool_user_entries
from fleetwarden.operator.runtime import (
    MODEL_DEPLOYMENTS_INDEX,
    POOL_USERS_INDEX,
    POOLS_INDEX,
    TENANT_POLICIES_INDEX,
)


def _by_key(body: kopf.Body, **_: Any) -> dict[str, ObjectRecord]:
    """Index an object under its key (`namespace/name`, or `name` when cluster-scoped)."""
    record = ObjectRecord.from_body(body)
    return {record.key: record}


async def _by_pool(body: kopf.Body, **_: Any) -> dict[str, str]:
    """Index a ModelDeployment's key under each pool it names. A coroutine, unlike `_by_key`:
    Kopf runs plain functions in its thread pool, a hop this cheap read does not need."""
    return pool_user_entries(body)


def register(registry: kopf.OperatorRegistry) -> None:
    for plural, index_id in (
        ("regionpools", POOLS_INDEX),
        ("modeldeployments", MODEL_DEPLOYMENTS_INDEX),
        ("tenantpolicies", TENANT_POLICIES_INDEX),
    ):
        kopf.index(GROUP, VERSION, plural, id=index_id, registry=registry)(_by_key)
    kopf.index(GROUP, VERSION, "modeldeployments", id=POOL_USERS_INDEX, registry=registry)(_by_pool)
