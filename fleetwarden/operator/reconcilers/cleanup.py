"""Deleting the children a ModelDeployment owns but no longer wants.

The serving children of a region removed from the spec and the spot children of a region whose
spot was disabled go the same way: list by selector, keep only what this object owns (a child
another owner adopted is not ours to delete), ask the caller whether each one should go, delete
it and say so in an Event. Errors are collected, never raised: one failed delete must not stop
the rest of the reconcile, and the caller reports them in its own status format.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fleetwarden.operator import naming
from fleetwarden.operator.events import NORMAL
from fleetwarden.operator.fleet import ObjectRecord
from fleetwarden.operator.kube import KubeApiError, ResourceKind
from fleetwarden.operator.reconcilers.context import Context

Unwanted = Callable[[str, str | None], str | None]
"""(child name, its pool label) -> why it must go, or None to keep it."""


async def delete_unwanted_children(
    ctx: Context,
    record: ObjectRecord,
    kinds: Iterable[ResourceKind],
    selector: str,
    unwanted: Unwanted,
    what: str = "children",
) -> list[str]:
    """Delete `record`'s own children of `kinds` matching `selector` that `unwanted` names a
    reason for; returns one message per failed list or delete."""
    errors: list[str] = []
    for kind in kinds:
        try:
            children = await ctx.kube.list(kind, record.namespace, selector)
        except KubeApiError as exc:
            errors.append(f"listing {what}: {exc}")
            continue
        for child in children:
            metadata: dict[str, Any] = child.get("metadata", {})
            owners = metadata.get("ownerReferences") or []
            if not any(o.get("uid") == record.uid for o in owners):
                continue
            name = metadata["name"]
            reason = unwanted(name, (metadata.get("labels") or {}).get(naming.POOL_LABEL))
            if reason is None:
                continue
            try:
                if await ctx.kube.delete(kind, name, record.namespace):
                    shown = child.get("kind", kind.plural)
                    ctx.events.post(record, NORMAL, "Deleted", f"Deleted {shown} {name}: {reason}")
            except KubeApiError as exc:
                errors.append(f"deleting {name}: {exc}")
    return errors
