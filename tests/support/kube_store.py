"""The emulated cluster's state and write semantics, without any HTTP.

Everything an operator can observe about a write lives here: resourceVersion
(one global counter, bumped on every write, like etcd's revision), uid,
creationTimestamp, generation bumps, optimistic-concurrency conflicts, the
status-subresource split, finalizers and ``deletionTimestamp``, namespace and
CRD termination, and the garbage collector's cascades through ownerReferences.

All methods are synchronous on purpose: the emulator runs in one event loop,
so a method that never awaits is atomic, exactly like one etcd transaction.
Stored objects are treated as immutable (every write stores a fresh dict),
so watch events can share them without copying.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import datetime
import json
import random
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import yaml

from tests.support import kube_errors as errors
from tests.support.kube_patch import (
    MalformedPatchError,
    PatchError,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from tests.support.kube_resources import ResourceType, crd_status, resources_from_crd
from tests.support.kube_schema import prune, validate
from tests.support.kube_validation import validate_crd, validate_metadata

ObjKey = tuple[str, str, str, str]  # (group, plural, namespace or "", name)
Obj = dict[str, Any]

_GENERATE_ALPHABET = (
    "bcdfghjklmnpqrstvwxz2456789"  # the apiserver's alphabet: no vowels, no lookalikes
)
_SERVER_META = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "resourceVersion",
    "selfLink",
    "managedFields",
)

PATCH_TYPES = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
]


def now_rfc3339() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """One entry of the cluster-wide change log that watches replay and follow."""

    rv: int
    storage_key: tuple[str, str]
    namespace: str
    type: str  # ADDED / MODIFIED / DELETED
    obj: Obj
    prev: Obj | None


@dataclasses.dataclass
class DeleteOptions:
    propagation: str = "Background"  # Background | Foreground | Orphan
    precondition_uid: str | None = None
    precondition_rv: str | None = None
    dry_run: bool = False

    @classmethod
    def parse(cls, body: Any, query: dict[str, str]) -> DeleteOptions:
        body = body if isinstance(body, dict) else {}
        propagation = body.get("propagationPolicy") or query.get("propagationPolicy")
        orphan = body.get("orphanDependents", query.get("orphanDependents"))
        if propagation is None and orphan in (True, "true"):
            propagation = "Orphan"
        if propagation not in (None, "Background", "Foreground", "Orphan"):
            raise errors.bad_request(f"propagationPolicy: Unsupported value: {propagation!r}")
        pre = body.get("preconditions") or {}
        dry_run = body.get("dryRun") or query.get("dryRun")
        return cls(
            propagation=propagation or "Background",
            precondition_uid=pre.get("uid"),
            precondition_rv=pre.get("resourceVersion"),
            dry_run=bool(dry_run),
        )


def _meta(obj: Obj) -> dict[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
        obj["metadata"] = meta
    return meta


class ClusterState:
    """Objects, resource types, and the change log of one emulated cluster."""

    def __init__(
        self,
        *,
        resources: Iterable[ResourceType],
        auto_create_namespaces: bool = False,
        history_limit: int = 100_000,
        on_commit: Callable[[WatchEvent, ResourceType], None] | None = None,
    ) -> None:
        self.resources: dict[tuple[str, str, str], ResourceType] = {}
        self.objects: dict[ObjKey, Obj] = {}
        self.uids: dict[str, ObjKey] = {}
        self.events: list[WatchEvent] = []
        self.rv = 0
        self.compacted_rv = 0  # events with rv <= this are forgotten: older watches get 410
        self.auto_create_namespaces = auto_create_namespaces
        self.history_limit = history_limit
        self.on_commit = on_commit
        self._crd_resources: dict[str, list[tuple[str, str, str]]] = {}
        self._dangling_checks: list[ObjKey] = []
        for rt in resources:
            self.register(rt)

    # -- resource registry -------------------------------------------------

    def register(self, rt: ResourceType) -> None:
        self.resources[(rt.group, rt.version, rt.plural)] = rt

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self.resources.get((group, version, plural))

    def by_storage(self, storage_key: tuple[str, str]) -> ResourceType | None:
        """The preferred (first-registered) version of a stored kind: used to render internally."""
        for rt in self.resources.values():
            if rt.storage_key == storage_key:
                return rt
        return None

    # -- reading -----------------------------------------------------------

    def key(self, rt: ResourceType, namespace: str | None, name: str) -> ObjKey:
        return (rt.group, rt.plural, (namespace or "") if rt.namespaced else "", name)

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self.objects.get(self.key(rt, namespace, name))
        if obj is None:
            raise errors.not_found(rt.group, rt.plural, name)
        return obj

    def select(
        self,
        rt: ResourceType,
        namespace: str | None,
        predicate: Callable[[Obj], bool] = lambda _: True,
    ) -> list[Obj]:
        """Objects of a kind, in etcd key order (namespace, name), optionally in one namespace."""
        found = [
            obj
            for (group, plural, ns, _), obj in self.objects.items()
            if (group, plural) == rt.storage_key
            and (namespace is None or ns == namespace)
            and predicate(obj)
        ]
        return sorted(
            found, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"])
        )

    @staticmethod
    def render(rt: ResourceType, obj: Obj) -> Obj:
        """The object as served at ``rt``'s version (CRD versions share storage: conversion None)."""
        return {
            "apiVersion": rt.api_version,
            "kind": rt.kind,
            **{k: v for k, v in obj.items() if k not in ("apiVersion", "kind")},
        }

    def namespace_exists(self, name: str) -> bool:
        return ("", "namespaces", "", name) in self.objects

    # -- committing --------------------------------------------------------

    def _commit(self, rt: ResourceType, event_type: str, obj: Obj, prev: Obj | None) -> Obj:
        self.rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self.rv)
        key = self.key(rt, meta.get("namespace"), meta["name"])
        if event_type == "DELETED":
            self.objects.pop(key, None)
            self.uids.pop(meta.get("uid", ""), None)
        else:
            self.objects[key] = obj
            self.uids[meta["uid"]] = key
        event = WatchEvent(
            self.rv, rt.storage_key, meta.get("namespace", ""), event_type, obj, prev
        )
        self.events.append(event)
        if len(self.events) > self.history_limit:
            drop = len(self.events) - self.history_limit // 2
            self.compacted_rv = self.events[drop - 1].rv
            del self.events[:drop]
        if self.on_commit is not None:
            self.on_commit(event, rt)
        return obj

    def compact(self) -> None:
        """Forget the change log, like etcd compaction: resuming older watches answers 410 Gone."""
        self.compacted_rv = self.rv
        self.events.clear()

    # -- validation helpers ------------------------------------------------

    def _apply_schema(self, rt: ResourceType, obj: Obj) -> Obj:
        if not rt.custom or rt.schema is None:
            return obj
        pruned: Obj = prune(obj, rt.schema, root=True)
        causes = validate(pruned, rt.schema)
        if causes:
            raise errors.invalid(rt.kind, rt.group, obj["metadata"].get("name", ""), causes)
        return pruned

    @staticmethod
    def _kind_specifics(rt: ResourceType, obj: Obj) -> None:
        """Server-side conversions that clients rely on (Secret.stringData is write-only)."""
        if rt.group == "" and rt.plural == "secrets" and isinstance(obj.get("stringData"), dict):
            data = dict(obj.get("data") or {})
            for key, value in obj.pop("stringData").items():
                data[key] = base64.b64encode(str(value).encode()).decode()
            obj["data"] = data

    @staticmethod
    def _spec_changed(rt: ResourceType, old: Obj, new: Obj) -> bool:
        ignored = {"metadata", "apiVersion", "kind"} | ({"status"} if rt.has_status else set())
        return {k: v for k, v in old.items() if k not in ignored} != {
            k: v for k, v in new.items() if k not in ignored
        }

    def _check_type(self, rt: ResourceType, body: Obj) -> None:
        kind = body.get("kind")
        api_version = body.get("apiVersion")
        if kind and kind != rt.kind:
            raise errors.bad_request(
                f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})"
            )
        if api_version and api_version != rt.api_version:
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match the expected API "
                f"version ({rt.api_version})"
            )

    # -- create ------------------------------------------------------------

    def create(
        self, rt: ResourceType, namespace: str | None, body: Any, *, dry_run: bool = False
    ) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        if rt.virtual:
            reviewed = copy.deepcopy(body)
            reviewed.setdefault("metadata", {})
            reviewed["status"] = {"allowed": True, "reason": "the emulator allows everything"}
            return self.render(rt, reviewed)
        self._check_type(rt, body)
        obj: Obj = copy.deepcopy(body)
        meta = _meta(obj)
        if rt.namespaced:
            if namespace is None:
                raise errors.method_not_allowed("POST")
            if meta.get("namespace") not in (None, "", namespace):
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise errors.internal("resourceVersion should not be set on objects to be created")
        name: str = meta.get("name") or ""
        if not name:
            prefix = meta.get("generateName")
            if not prefix:
                raise errors.invalid(
                    rt.kind,
                    rt.group,
                    "",
                    [
                        (
                            "FieldValueRequired",
                            "metadata.name",
                            "Required value: name or generateName is required",
                        )
                    ],
                )
            for _ in range(100):
                name = prefix + "".join(random.choice(_GENERATE_ALPHABET) for _ in range(5))
                if self.key(rt, namespace, name) not in self.objects:
                    break
            meta["name"] = name
        validate_metadata(rt, obj, name)
        if rt.namespaced:
            self._ensure_namespace_usable(rt, namespace or "", name)
        if self.key(rt, namespace, name) in self.objects:
            raise errors.already_exists(rt.group, rt.plural, name)
        for field in _SERVER_META:
            meta.pop(field, None)
        if rt.has_status:
            obj.pop("status", None)
        self._kind_specifics(rt, obj)
        if rt.group == "apiextensions.k8s.io" and rt.plural == "customresourcedefinitions":
            validate_crd(obj)
            obj["status"] = crd_status(obj, now_rfc3339())
        if rt.group == "" and rt.plural == "namespaces":
            obj.setdefault("spec", {})["finalizers"] = ["kubernetes"]
            obj["status"] = {"phase": "Active"}
        obj = self._apply_schema(rt, obj)
        meta = obj["metadata"]
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        if dry_run:
            return self.render(rt, obj)
        self._commit(rt, "ADDED", obj, None)
        if rt.group == "apiextensions.k8s.io" and rt.plural == "customresourcedefinitions":
            self._register_crd(obj)
        if meta.get("ownerReferences"):
            self._dangling_checks.append(self.key(rt, namespace, name))
        return self.render(rt, obj)

    def _ensure_namespace_usable(self, rt: ResourceType, namespace: str, name: str) -> None:
        ns_obj = self.objects.get(("", "namespaces", "", namespace))
        if ns_obj is None:
            if not self.auto_create_namespaces:
                raise errors.not_found("", "namespaces", namespace)
            ns_rt = self.lookup("", "v1", "namespaces")
            assert ns_rt is not None
            self.create(ns_rt, None, {"metadata": {"name": namespace}})
        elif ns_obj["metadata"].get("deletionTimestamp"):
            raise errors.forbidden(
                rt.group,
                rt.plural,
                name,
                f"unable to create new content in namespace {namespace} because it is being terminated",
            )

    # -- update / patch ----------------------------------------------------

    def replace(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        current = self.get(rt, namespace, name)
        self._check_type(rt, body)
        wanted_rv = (body.get("metadata") or {}).get("resourceVersion")
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.group, rt.plural, name)
        return self._write(
            rt, current, copy.deepcopy(body), subresource=subresource, dry_run=dry_run
        )

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        raw: bytes,
        content_type: str,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> tuple[Obj, int]:
        """Apply a PATCH; returns the object and the HTTP code (201 when apply created it)."""
        media = content_type.split(";")[0].strip().lower()
        if media not in PATCH_TYPES or (
            media == "application/strategic-merge-patch+json" and rt.custom
        ):
            accepted = [t for t in PATCH_TYPES if not (rt.custom and "strategic" in t)]
            raise errors.unsupported_media_type(media, accepted)
        try:
            document = (
                yaml.safe_load(raw) if media == "application/apply-patch+yaml" else _json(raw)
            )
        except (ValueError, yaml.YAMLError) as exc:
            raise errors.bad_request(f"error decoding patch: {exc}") from None
        key = self.key(rt, namespace, name)
        if media == "application/apply-patch+yaml":
            if not field_manager:
                raise errors.bad_request(
                    "PATCH, application/apply-patch+yaml: fieldManager is required for apply requests"
                )
            if not isinstance(document, dict):
                raise errors.bad_request(
                    "error decoding YAML: the apply configuration must be an object"
                )
            if key not in self.objects and subresource is None:
                document.setdefault("metadata", {}).setdefault("name", name)
                if document["metadata"]["name"] != name:
                    raise errors.bad_request(
                        f"the name of the object ({document['metadata']['name']}) does not match the name "
                        f"on the URL ({name})"
                    )
                return self.create(rt, namespace, document, dry_run=dry_run), 201
        current = self.get(rt, namespace, name)
        rendered = self.render(rt, current)
        try:
            if media == "application/json-patch+json":
                patched = json_patch(rendered, document)
            elif media == "application/merge-patch+json" or (
                media.startswith("application/apply") and rt.custom
            ):
                patched = merge_patch(rendered, document)
            else:
                patched = strategic_merge_patch(rendered, document)
        except MalformedPatchError as exc:
            raise errors.bad_request(str(exc)) from None
        except PatchError as exc:
            raise errors.patch_rejected(str(exc)) from None
        if not isinstance(patched, dict):
            raise errors.bad_request("the patched object must be a JSON object")
        wanted_rv = (patched.get("metadata") or {}).get("resourceVersion")
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.group, rt.plural, name)
        return self._write(rt, current, patched, subresource=subresource, dry_run=dry_run), 200

    def _write(
        self, rt: ResourceType, current: Obj, new: Obj, *, subresource: str | None, dry_run: bool
    ) -> Obj:
        name = current["metadata"]["name"]
        namespace = current["metadata"].get("namespace")
        if subresource == "status":
            merged = copy.deepcopy(current)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            new = merged
        else:
            new_meta = _meta(new)
            if new_meta.get("name", name) != name:
                raise errors.bad_request(
                    f"the name of the object ({new_meta.get('name')}) does not match the name on the URL ({name})"
                )
            if rt.namespaced and new_meta.get("namespace", namespace) != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            new_meta["name"] = name
            if namespace is not None:
                new_meta["namespace"] = namespace
            else:
                new_meta.pop("namespace", None)
            for field in _SERVER_META:
                if field in current["metadata"]:
                    new_meta[field] = current["metadata"][field]
                else:
                    new_meta.pop(field, None)
            if rt.has_status:
                if "status" in current:
                    new["status"] = copy.deepcopy(current["status"])
                else:
                    new.pop("status", None)
            if rt.group == "" and rt.plural == "namespaces":
                new["spec"] = copy.deepcopy(
                    current.get("spec", {})
                )  # spec.finalizers: /finalize only
            validate_metadata(rt, new, name)
            old_finalizers = set(current["metadata"].get("finalizers") or [])
            added = [f for f in new_meta.get("finalizers") or [] if f not in old_finalizers]
            if current["metadata"].get("deletionTimestamp") and added:
                raise errors.invalid(
                    rt.kind,
                    rt.group,
                    name,
                    [
                        (
                            "FieldValueForbidden",
                            "metadata.finalizers",
                            f"Forbidden: no new finalizers can be added if the object is being deleted, "
                            f"found new finalizers {added!r}",
                        )
                    ],
                )
            self._kind_specifics(rt, new)
        new["apiVersion"] = current.get("apiVersion", rt.api_version)
        new["kind"] = rt.kind
        new = self._apply_schema(rt, new)
        if self._spec_changed(rt, current, new):
            new["metadata"]["generation"] = int(current["metadata"].get("generation", 1)) + 1
        if new == current:
            return self.render(rt, current)  # a no-op write: no new resourceVersion, no event
        if dry_run:
            return self.render(rt, new)
        meta = new["metadata"]
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not self._blocks_removal(rt, new)
        ):
            return self.render(rt, self._remove(rt, new, current))
        self._commit(rt, "MODIFIED", new, current)
        if rt.group == "apiextensions.k8s.io" and rt.plural == "customresourcedefinitions":
            self._register_crd(new)
        self._after_change()
        return self.render(rt, new)

    # -- delete & garbage collection --------------------------------------

    def delete(
        self, rt: ResourceType, namespace: str | None, name: str, options: DeleteOptions
    ) -> Obj:
        """DELETE: mark with deletionTimestamp if finalizers block it, otherwise remove and cascade."""
        current = self.get(rt, namespace, name)
        meta = current["metadata"]
        if options.precondition_uid and options.precondition_uid != meta["uid"]:
            raise errors.conflict(
                rt.group,
                rt.plural,
                name,
                f"Precondition failed: UID in precondition: {options.precondition_uid}, "
                f"UID in object meta: {meta['uid']}",
            )
        if options.precondition_rv and options.precondition_rv != meta["resourceVersion"]:
            raise errors.conflict(
                rt.group,
                rt.plural,
                name,
                f"Precondition failed: ResourceVersion in precondition: "
                f"{options.precondition_rv}, ResourceVersion in object meta: "
                f"{meta['resourceVersion']}",
            )
        if options.dry_run:
            return self._deletion_response(rt, current)
        if meta.get("deletionTimestamp"):
            return self.render(rt, current)  # already terminating: nothing changes
        if options.propagation == "Orphan":
            self._orphan_dependents(meta["uid"])
            current = self.get(rt, namespace, name)
        finalizers = list(current["metadata"].get("finalizers") or [])
        if options.propagation == "Foreground" and self._dependents(meta["uid"]):
            finalizers.append("foregroundDeletion")
        if finalizers or self._blocks_removal(rt, current):
            marked = copy.deepcopy(current)
            marked_meta = marked["metadata"]
            marked_meta["finalizers"] = finalizers
            if not finalizers:
                marked_meta.pop("finalizers")
            marked_meta["deletionTimestamp"] = now_rfc3339()
            marked_meta["deletionGracePeriodSeconds"] = 0
            marked_meta["generation"] = int(marked_meta.get("generation", 1)) + 1
            if rt.group == "" and rt.plural == "namespaces":
                marked["status"] = {**marked.get("status", {}), "phase": "Terminating"}
            self._commit(rt, "MODIFIED", marked, current)
            self._start_termination(rt, marked)
            self._after_change()
            return self.render(rt, self.objects.get(self.key(rt, namespace, name), marked))
        return self._deletion_response(rt, self._remove(rt, current, current))

    def _deletion_response(self, rt: ResourceType, obj: Obj) -> Obj:
        if rt.returns_deleted_object:
            return self.render(rt, obj)
        return errors.success_status(
            rt.group, rt.plural, obj["metadata"]["name"], obj["metadata"]["uid"]
        )

    def _blocks_removal(self, rt: ResourceType, obj: Obj) -> bool:
        """Namespaces and CRDs stay Terminating while their contents still exist."""
        if rt.group == "" and rt.plural == "namespaces":
            name = obj["metadata"]["name"]
            return any(ns == name for (_, _, ns, _) in self.objects)
        if rt.group == "apiextensions.k8s.io" and rt.plural == "customresourcedefinitions":
            spec = obj.get("spec") or {}
            storage = (spec.get("group", ""), (spec.get("names") or {}).get("plural", ""))
            return any((g, p) == storage for (g, p, _, _) in self.objects)
        return False

    def _start_termination(self, rt: ResourceType, obj: Obj) -> None:
        """What the namespace controller / CRD finalizer do: delete everything inside."""
        if rt.group == "" and rt.plural == "namespaces":
            name = obj["metadata"]["name"]
            victims = [key for key in self.objects if key[2] == name]
        elif rt.group == "apiextensions.k8s.io" and rt.plural == "customresourcedefinitions":
            spec = obj.get("spec") or {}
            storage = (spec.get("group", ""), (spec.get("names") or {}).get("plural", ""))
            victims = [key for key in self.objects if (key[0], key[1]) == storage]
        else:
            dependents = self._dependents(obj["metadata"]["uid"])
            if "foregroundDeletion" in (obj["metadata"].get("finalizers") or []):
                victims = dependents
            else:
                return
        for key in victims:
            self._delete_key(key)

    def _delete_key(self, key: ObjKey, propagation: str = "Background") -> None:
        obj = self.objects.get(key)
        rt = self.by_storage((key[0], key[1]))
        if obj is None or rt is None:
            return
        self.delete(rt, key[2] or None, key[3], DeleteOptions(propagation=propagation))

    def _remove(self, rt: ResourceType, final: Obj, prev: Obj) -> Obj:
        removed = copy.deepcopy(final)
        self._commit(rt, "DELETED", removed, prev)
        if rt.group == "apiextensions.k8s.io" and rt.plural == "customresourcedefinitions":
            for resource_key in self._crd_resources.pop(removed["metadata"]["name"], []):
                self.resources.pop(resource_key, None)
        self._collect_garbage(removed["metadata"]["uid"])
        self._after_change()
        return removed

    def _dependents(self, uid: str) -> list[ObjKey]:
        return [
            key
            for key, obj in self.objects.items()
            if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])
        ]

    def _collect_garbage(self, owner_uid: str) -> None:
        """Background cascade: dependents whose owners are all gone are deleted, others unlinked."""
        for key in self._dependents(owner_uid):
            obj = self.objects.get(key)
            rt = self.by_storage((key[0], key[1]))
            if obj is None or rt is None:
                continue
            refs = obj["metadata"].get("ownerReferences") or []
            alive = [
                ref for ref in refs if ref.get("uid") != owner_uid and ref.get("uid") in self.uids
            ]
            if alive:
                unlinked = copy.deepcopy(obj)
                unlinked["metadata"]["ownerReferences"] = [
                    r for r in refs if r.get("uid") != owner_uid
                ]
                self._commit(rt, "MODIFIED", unlinked, obj)
            else:
                self._delete_key(key)

    def _orphan_dependents(self, owner_uid: str) -> None:
        for key in self._dependents(owner_uid):
            obj = self.objects[key]
            rt = self.by_storage((key[0], key[1]))
            assert rt is not None
            orphaned = copy.deepcopy(obj)
            refs = [r for r in obj["metadata"]["ownerReferences"] if r.get("uid") != owner_uid]
            if refs:
                orphaned["metadata"]["ownerReferences"] = refs
            else:
                orphaned["metadata"].pop("ownerReferences")
            self._commit(rt, "MODIFIED", orphaned, obj)

    def _after_change(self) -> None:
        """Re-check objects waiting for something to disappear (foreground owners, namespaces, CRDs)."""
        progress = True
        while progress:
            progress = False
            for key, obj in list(self.objects.items()):
                meta = obj["metadata"]
                if not meta.get("deletionTimestamp") or key not in self.objects:
                    continue
                rt = self.by_storage((key[0], key[1]))
                if rt is None:
                    continue
                finalizers = meta.get("finalizers") or []
                if "foregroundDeletion" in finalizers and not self._dependents(meta["uid"]):
                    released = copy.deepcopy(obj)
                    released["metadata"]["finalizers"] = [
                        f for f in finalizers if f != "foregroundDeletion"
                    ]
                    if not released["metadata"]["finalizers"]:
                        released["metadata"].pop("finalizers")
                        self._remove(rt, released, obj)
                    else:
                        self._commit(rt, "MODIFIED", released, obj)
                    progress = True
                elif not finalizers and not self._blocks_removal(rt, obj):
                    self._remove(rt, obj, obj)
                    progress = True

    def collect_dangling(self) -> None:
        """Delete new objects whose owners never existed, as the GC controller eventually does."""
        checks, self._dangling_checks = self._dangling_checks, []
        for key in checks:
            obj = self.objects.get(key)
            if obj is None:
                continue
            refs = obj["metadata"].get("ownerReferences") or []
            if refs and not any(ref.get("uid") in self.uids for ref in refs):
                self._delete_key(key)

    # -- CRDs ----------------------------------------------------------------

    def _register_crd(self, crd: Obj) -> None:
        name = crd["metadata"]["name"]
        for resource_key in self._crd_resources.pop(name, []):
            self.resources.pop(resource_key, None)
        keys = []
        for rt in resources_from_crd(crd):
            self.register(rt)
            keys.append((rt.group, rt.version, rt.plural))
        self._crd_resources[name] = keys


def _json(raw: bytes) -> Any:
    return json.loads(raw) if raw else None
