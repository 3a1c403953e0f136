"""Collection-level reads and writes: selectors, paged lists, deletecollection, ``/scale``.

These sit between the HTTP layer and :class:`ClusterState`: they interpret
query parameters (``labelSelector``, ``fieldSelector``, ``limit``, ``continue``)
exactly as the server does, so an operator's selectors are really exercised.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from tests.support import kube_errors as errors
from tests.support.kube_errors import ApiError
from tests.support.kube_resources import ResourceType
from tests.support.kube_selectors import SelectorError, parse_field_selector, parse_label_selector
from tests.support.kube_store import ClusterState, DeleteOptions, Obj


def selectors(query: Mapping[str, str], name: str | None = None) -> Callable[[Obj], bool]:
    """Compile ``labelSelector``/``fieldSelector`` (and a watched name) into one predicate."""
    try:
        labels = parse_label_selector(query.get("labelSelector"))
        fields = parse_field_selector(query.get("fieldSelector"))
    except SelectorError as exc:
        raise errors.bad_request(f"unable to parse requirement: {exc}") from None
    return lambda obj: (
        labels(obj) and fields(obj) and (name is None or obj["metadata"]["name"] == name)
    )


def list_objects(
    state: ClusterState, rt: ResourceType, namespace: str | None, query: Mapping[str, str]
) -> dict[str, Any]:
    """LIST with selectors and ``limit``/``continue`` paging (the token is the last key served).

    Items of built-in kinds carry no ``kind``/``apiVersion``, as in the server's
    typed lists (Kopf fills them from the list); custom resources carry both.
    """
    objs = state.select(rt, namespace, selectors(query))
    token = query.get("continue")
    if token:
        try:
            after = tuple(json.loads(token))
        except ValueError:
            raise errors.bad_request("continue key is not valid") from None
        objs = [
            o for o in objs if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > after
        ]
    meta: dict[str, Any] = {"resourceVersion": str(state.rv)}
    limit = int(query.get("limit") or 0)
    if 0 < limit < len(objs):
        last = objs[limit - 1]["metadata"]
        meta["continue"] = json.dumps([last.get("namespace", ""), last["name"]])
        meta["remainingItemCount"] = len(objs) - limit
        objs = objs[:limit]
    items = []
    for obj in objs:
        item = state.render(rt, obj)
        if not rt.custom:
            item = {k: v for k, v in item.items() if k not in ("apiVersion", "kind")}
        items.append(item)
    return {"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": meta, "items": items}


def delete_collection(
    state: ClusterState,
    rt: ResourceType,
    namespace: str | None,
    query: Mapping[str, str],
    options: DeleteOptions,
) -> dict[str, Any]:
    """DELETE on a collection URL: delete every selected object, answer the list of them."""
    deleted = []
    for obj in state.select(rt, namespace, selectors(query)):
        meta = obj["metadata"]
        with contextlib.suppress(ApiError):  # gone meanwhile (e.g. cascaded): not an error
            state.delete(rt, meta.get("namespace"), meta["name"], options)
            deleted.append(state.render(rt, obj))
    return {
        "kind": rt.list_kind,
        "apiVersion": rt.api_version,
        "metadata": {"resourceVersion": str(state.rv)},
        "items": deleted,
    }


def scale_of(obj: Obj) -> dict[str, Any]:
    """The ``autoscaling/v1 Scale`` view of an object with ``spec.replicas``."""
    meta = obj["metadata"]
    match_labels = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    kept = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {k: meta[k] for k in kept if k in meta},
        "spec": {"replicas": (obj.get("spec") or {}).get("replicas", 0)},
        "status": {
            "replicas": (obj.get("status") or {}).get("replicas", 0),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(match_labels.items())),
        },
    }


def write_scale(
    state: ClusterState,
    rt: ResourceType,
    namespace: str | None,
    name: str,
    method: str,
    body: bytes,
    content_type: str,
) -> dict[str, Any]:
    """PUT/PATCH ``/scale``: patch the Scale view, then write its ``spec.replicas`` back."""
    obj = state.get(rt, namespace, name)
    scale_rt = ResourceType(
        group="autoscaling", version="v1", plural="scale", kind="Scale", namespaced=rt.namespaced
    )
    scratch = ClusterState(resources=[scale_rt])
    scratch.objects[scratch.key(scale_rt, namespace, name)] = scale_of(obj)
    if method == "PUT":
        wanted = json.loads(body or b"{}")
    else:
        wanted, _ = scratch.patch(scale_rt, namespace, name, body, content_type, dry_run=True)
    wanted_rv = (wanted.get("metadata") or {}).get("resourceVersion")
    if wanted_rv and wanted_rv != obj["metadata"]["resourceVersion"]:
        raise errors.conflict(rt.group, rt.plural, name)
    replicas = (wanted.get("spec") or {}).get("replicas", 0)
    patch = json.dumps({"spec": {"replicas": replicas}}).encode()
    updated, _ = state.patch(rt, namespace, name, patch, "application/merge-patch+json")
    return scale_of(updated)
