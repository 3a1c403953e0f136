"""Make one child object in the cluster match its desired form: create, patch drift, or leave alone.

Reads first and writes only on a difference, so a reconcile of an unchanged fleet sends no writes
(idempotency is a property tests check by counting requests). An object another ModelDeployment
controls is never taken over: two owners would patch it back and forth forever.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fleetwarden.operator.drift import drifted_paths, merge_patch_for
from fleetwarden.operator.kube import ConflictError, KubeApiError, KubeClient, kind_of

JsonDict = dict[str, Any]

Adjust = Callable[[JsonDict, JsonDict], JsonDict]
"""(desired, live) -> what to apply over that live object (e.g. keep an immutable field)."""


class ControlledElsewhereError(KubeApiError):
    """The object exists and another owner controls it; nothing was written."""

    def __init__(self, kind: str, name: str, owner: JsonDict) -> None:
        super().__init__(
            409,
            "ControlledElsewhere",
            f"{kind} {name} belongs to {owner.get('kind')} {owner.get('name')} "
            f"(uid {owner.get('uid')}), not to this one; it is left alone",
        )


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


def _controller(obj: JsonDict) -> JsonDict | None:
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return ref
    return None


def check_controller(desired: JsonDict, live: JsonDict) -> None:
    """Raise `ControlledElsewhereError` when `live` is controlled by another owner than the one
    `desired` names. Same kind and name with another uid is an earlier object of that name
    (deleted, its children not yet collected) and is taken over, as is an object nothing
    controls; another name is another owner whose child has the same name (ModelDeployment `a`
    in pool `b-c` and `a-b` in pool `c` both name theirs `a-b-c`)."""
    mine, theirs = _controller(desired), _controller(live)
    if mine is None or theirs is None or theirs.get("uid") == mine.get("uid"):
        return
    if (theirs.get("kind"), theirs.get("name")) != (mine.get("kind"), mine.get("name")):
        raise ControlledElsewhereError(
            str(live.get("kind") or desired.get("kind")), desired["metadata"]["name"], theirs
        )


async def apply(kube: KubeClient, desired: JsonDict, adjust: Adjust | None = None) -> Applied:
    """Create `desired` if absent; patch it if the live object drifted; else do nothing.

    `adjust` rewrites `desired` against the live object before comparing (see
    `builders.keep_selector`); a created object is `desired` as given."""
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
    check_controller(desired, live)
    if adjust is not None:
        desired = adjust(desired, live)
    owned = _owned_fields(desired)
    drift = drifted_paths(owned, live)
    if not drift:
        return Applied(Action.UNCHANGED, live)
    patched = await kube.merge_patch(kind, name, merge_patch_for(owned, live), namespace)
    return Applied(Action.UPDATED, patched, tuple(drift))
