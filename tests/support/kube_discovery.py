"""Discovery, version and OpenAPI endpoints, computed from the served resource types.

Kopf scans ``/api`` and ``/apis`` and every group-version to learn what exists
(it does not start watching until ``v1/namespaces`` is discoverable); client-go
inside Helm does the same, then reads ``/openapi/v3`` to decide how to
validate. Everything here is derived from :class:`ClusterState.resources`, so a
newly created CRD is discoverable at once, like on a real cluster.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tests.support import kube_errors as errors
from tests.support.kube_resources import ResourceType, group_discovery
from tests.support.kube_routing import Route
from tests.support.kube_store import ClusterState

SERVER_VERSION = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0",
    "gitCommit": "emulated",
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T00:00:00Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def groups(state: ClusterState) -> list[dict[str, Any]]:
    """``APIGroup`` entries, built-in groups first, then CRD groups in creation order."""
    versions: dict[str, list[str]] = {}
    for rt in state.resources.values():
        if rt.group and rt.version not in versions.setdefault(rt.group, []):
            versions[rt.group].append(rt.version)
    return [group_discovery(group, vs) for group, vs in versions.items()]


def discovery(state: ClusterState, route: Route, host: str) -> dict[str, Any]:
    """The document for ``/api``, ``/apis``, ``/apis/{group}`` or ``/api[s]/.../{version}``."""
    if route.level == "api":
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
        }
    if route.level == "apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups(state)}
    if route.level == "group":
        for group in groups(state):
            if group["name"] == route.group:
                return {"kind": "APIGroup", "apiVersion": "v1", **group}
        raise errors.resource_not_found()
    resources = [
        rt
        for rt in state.resources.values()
        if (rt.group, rt.version) == (route.group, route.version)
    ]
    if not resources:
        raise errors.resource_not_found()
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": resources[0].group_version,
        "resources": [entry for rt in resources for entry in rt.discovery_entries()],
    }


def non_resource(state: ClusterState, path: str) -> dict[str, Any] | str:
    """``/version``, health checks, the root path list and OpenAPI; a str means plain text."""
    if path == "/version":
        return SERVER_VERSION
    if path in ("/healthz", "/livez", "/readyz"):
        return "ok"
    if path == "/":
        paths = {"/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"}
        paths |= {"/openapi/v2", "/openapi/v3"}
        for group in groups(state):
            paths.add(f"/apis/{group['name']}")
            paths.update(f"/apis/{v['groupVersion']}" for v in group["versions"])
        return {"paths": sorted(paths)}
    if path == "/openapi/v2":
        # Well-formed but empty: clients validating against it find no schemas to apply.
        info = {"title": "Kubernetes", "version": SERVER_VERSION["gitVersion"]}
        return {"swagger": "2.0", "info": info, "paths": {}, "definitions": {}}
    if path == "/openapi/v3":
        return {
            "paths": {
                gv_path: {"serverRelativeURL": f"/openapi/v3/{gv_path}?hash={_hash(rts)}"}
                for gv_path, rts in _openapi_group_versions(state).items()
            }
        }
    if path.startswith("/openapi/v3/"):
        gv_path = path.removeprefix("/openapi/v3/")
        served = _openapi_group_versions(state)
        if gv_path in served:
            return openapi_v3_document(gv_path, served[gv_path])
    raise errors.resource_not_found()


def _openapi_group_versions(state: ClusterState) -> dict[str, list[ResourceType]]:
    result: dict[str, list[ResourceType]] = {}
    for rt in state.resources.values():
        gv_path = f"apis/{rt.group}/{rt.version}" if rt.group else f"api/{rt.version}"
        result.setdefault(gv_path, []).append(rt)
    return result


def _hash(resources: list[ResourceType]) -> str:
    """Changes whenever the group-version's kinds change, so clients' caches refresh."""
    names = sorted(f"{rt.plural}:{rt.kind}" for rt in resources)
    return hashlib.sha256(json.dumps(names).encode()).hexdigest()[:16].upper()


def openapi_v3_document(gv_path: str, resources: list[ResourceType]) -> dict[str, Any]:
    """A minimal OpenAPI v3 document per group-version.

    client-go (inside Helm) decides between server-side field validation and
    client-side schema validation by looking for a ``fieldValidation`` parameter
    on the PATCH operation of each kind here. Declaring it makes Helm trust the
    server (this emulator accepts any schema for built-ins); without it, Helm
    falls back to ``/openapi/v2`` in protobuf, which the emulator does not speak.
    """
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    params = [
        {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
        {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
    ]
    for rt in resources:
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        scope = "/namespaces/{namespace}" if rt.namespaced else ""
        operation = {
            "x-kubernetes-group-version-kind": gvk,
            "x-kubernetes-action": "patch",
            "parameters": params,
            "responses": {"200": {"description": "OK"}},
        }
        paths[f"/{gv_path}{scope}/{rt.plural}/{{name}}"] = {"patch": operation}
        schemas[f"{rt.group or 'core'}.{rt.version}.{rt.kind}"] = {
            "type": "object",
            "x-kubernetes-group-version-kind": [gvk],
            "x-kubernetes-preserve-unknown-fields": True,
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": SERVER_VERSION["gitVersion"]},
        "paths": paths,
        "components": {"schemas": schemas},
    }
