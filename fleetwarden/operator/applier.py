"""Make one child object in the cluster match its desired form: create, patch drift, or leave alone.

Reads first and writes only on a difference, so a reconcile of an unchanged fleet sends no writes
(idempotency is a property tests check by counting requests).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fleetwarden.operator.drift import drifted_paths, merge_patch_for
from fleetwarden.operator.kube import ConflictError, KubeClient, kind_of

JsonDict = dict[str, Any]


class Action(StrEnum):
    CREATED = "Created"
    UPDATED = "Updated"
    UNCHANGED = "Unchanged"


@dataclass(frozen=True)
class Applied:
    """What applying one object did, and the object as the server now holds it."""

    action: Action
    live: JsonDict
    drifted: tuple[str, ...] = ()

    def describe(self) -> str:
        kind, name = self.live.get("kind", "object"), self.live["metadata"]["name"]
        if self.action is Action.UPDATED:
            shown = ", ".join(p.lstrip(".") for p in self.drifted[:5])
            more = f" and {len(self.drifted) - 5} more" if len(self.drifted) > 5 else ""
            return f"{self.action} {kind} {name}: set {shown}{more}"
        return f"{self.action} {kind} {name}"


def _owned_fields(desired: JsonDict) -> JsonDict:
    """The part of an object the operator owns: identity and metadata it sets, spec or data."""
    return {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "status")}


async def apply(kube: KubeClient, desired: JsonDict) -> Applied:
    """Create `desired` if absent; patch it if the live object drifted; else do nothing."""
    kind = kind_of(desired)
    name = desired["metadata"]["name"]
    namespace = desired["metadata"].get("namespace")
    live = await kube.get(kind, name, namespace)
    if live is None:
        try:
            return Applied(Action.CREATED, await kube.create(desired))
        except ConflictError:
            # Created by someone else (or an earlier, timed-out attempt) since we looked: re-read.
            live = await kube.get(kind, name, namespace)
            if live is None:
                raise
    owned = _owned_fields(desired)
    drift = drifted_paths(owned, live)
    if not drift:
        return Applied(Action.UNCHANGED, live)
    patched = await kube.merge_patch(kind, name, merge_patch_for(owned, live), namespace)
    return Applied(Action.UPDATED, patched, tuple(drift))
