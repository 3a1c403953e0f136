"""Reconcile one RegionPool's status: what each ModelDeployment takes from it and what is free.

A pool has no children; its status is a sum over the ModelDeployments that use it, so it is
recomputed whenever one of them changes as well as when the pool itself does.
"""

from __future__ import annotations

from typing import Any

from fleetwarden.operator import conditions
from fleetwarden.operator.accounting_cache import AccountingCache, fleet_accounting
from fleetwarden.operator.conditions import ConditionUpdate
from fleetwarden.operator.fleet import FleetView, parse_pool
from fleetwarden.operator.kube import REGION_POOLS
from fleetwarden.operator.reconcilers.context import Context, invalid_spec, write_status

JsonDict = dict[str, Any]


async def reconcile_region_pool(
    ctx: Context, view: FleetView, name: str, accounting: AccountingCache | None = None
) -> None:
    """Write the allocation of RegionPool `name` into its status, with Ready/Degraded.

    `accounting` keeps the fleet's pool accounting between reconciles (the runtime passes its
    own); without it the accounting is computed afresh from `view`.
    """
    record = view.pools.get(name)
    if record is None:
        return
    parsed = parse_pool(record)
    status: JsonDict = {}
    if parsed.spec is None:
        updates = invalid_spec(parsed.error or "invalid spec")
    else:
        usage = fleet_accounting(view, accounting).usage[name]
        status.update(
            {
                "allocations": [
                    {"modelDeployment": md, "instances": instances, "gpus": gpus}
                    for md, (instances, gpus) in sorted(usage.allocations.items())
                ],
                "allocatedInstances": usage.instances,
                "allocatedGpus": usage.gpus,
                "freeInstances": usage.free_instances,
                "freeGpus": usage.free_gpus,
            }
        )
        capacity = parsed.spec.capacity
        if usage.overcommitted:
            message = (
                f"{usage.instances} instances / {usage.gpus} GPUs requested, capacity "
                f"{capacity.instances if capacity.instances is not None else '-'} instances / "
                f"{capacity.gpus if capacity.gpus is not None else '-'} GPUs"
            )
            degraded = ConditionUpdate(conditions.DEGRADED, True, conditions.OVERCOMMITTED, message)
        else:
            degraded = ConditionUpdate(conditions.DEGRADED, False, conditions.AS_EXPECTED, "")
        updates = [
            ConditionUpdate(conditions.READY, True, conditions.RECONCILED, "capacity accounted"),
            degraded,
        ]
    await write_status(ctx, REGION_POOLS, record, status, updates)
