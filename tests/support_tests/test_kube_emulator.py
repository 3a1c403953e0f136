"""Self-tests of the Kubernetes API emulator: it must behave like a real API server.

Every test asserts on what a real kube-apiserver would answer (status codes,
``Status`` bodies, metadata bookkeeping, watch event sequences), because the
operator's tests are only as trustworthy as the emulator underneath them.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.support.kube_emulator import KubeEmulator
from tests.support.kube_resources import crd_manifest

GROUP = "test.fleetwarden.dev"
WIDGETS = f"/apis/{GROUP}/v1/namespaces/default/widgets"
CMS = "/api/v1/namespaces/default/configmaps"
DEPLOYS = "/apis/apps/v1/namespaces/default/deployments"
WIDGET_SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "size": {"type": "integer", "minimum": 0},
                "mode": {"type": "string", "enum": ["fast", "slow"]},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        },
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    },
}


@pytest.fixture
async def emu() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator(bookmark_interval=0.2) as emulator:
        await emulator.apply_crd(
            crd_manifest(GROUP, "Widget", short_names=("wg",), schema=WIDGET_SCHEMA)
        )
        yield emulator


_OPEN_WATCHES: list[Watch] = []


@pytest.fixture
async def http(emu: KubeEmulator) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(emu.url) as session:
        yield session
        while _OPEN_WATCHES:  # release streaming connections before the session goes
            _OPEN_WATCHES.pop().response.close()


async def call(
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
    **params: str,
) -> tuple[int, Any]:
    data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
    async with http.request(
        method, path, data=data, params=params, headers={"Content-Type": content_type}
    ) as response:
        text = await response.text()
        return response.status, json.loads(text) if text.startswith(("{", "[")) else text


def cm(name: str, labels: dict[str, str] | None = None, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels or {}},
        "data": data,
    }


def deployment(name: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}]},
                        {"name": "sidecar", "image": "side:1"},
                    ]
                },
            },
        },
    }


def widget(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


class Watch:
    """A raw watch stream reader: the exact events a client would see."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def next(self, timeout: float = 3.0) -> dict[str, Any]:  # noqa: ASYNC109
        async with asyncio.timeout(timeout):
            line = await self.response.content.readline()
        assert line, "the watch stream ended unexpectedly"
        event: dict[str, Any] = json.loads(line)
        return event

    async def take(self, count: int, *, skip_bookmarks: bool = True) -> list[tuple[str, str]]:
        """The next ``count`` events as ``(type, name)``."""
        events: list[tuple[str, str]] = []
        while len(events) < count:
            event = await self.next()
            if skip_bookmarks and event["type"] == "BOOKMARK":
                continue
            events.append((event["type"], event["object"]["metadata"].get("name", "")))
        return events


async def open_watch(http: aiohttp.ClientSession, path: str, **params: str) -> Watch:
    response = await http.get(path, params={"watch": "true", **params})
    assert response.status == 200
    watch = Watch(response)
    _OPEN_WATCHES.append(watch)
    return watch


# --- create / read -------------------------------------------------------------------------


async def test_create_answers_201_with_server_managed_metadata(http: aiohttp.ClientSession) -> None:
    status, body = await call(http, "POST", CMS, cm("a", x="1"))
    assert status == 201
    meta = body["metadata"]
    assert meta["namespace"] == "default"
    assert meta["uid"]
    assert meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1
    assert int(meta["resourceVersion"]) > 0
    status, fetched = await call(http, "GET", f"{CMS}/a")
    assert status == 200
    assert fetched == body


async def test_create_of_existing_name_is_409_already_exists(http: aiohttp.ClientSession) -> None:
    await call(http, "POST", CMS, cm("a"))
    status, body = await call(http, "POST", CMS, cm("a"))
    assert status == 409
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'configmaps "a" already exists',
        "reason": "AlreadyExists",
        "details": {"name": "a", "kind": "configmaps"},
        "code": 409,
    }


async def test_missing_object_is_404_not_found_with_group(http: aiohttp.ClientSession) -> None:
    status, body = await call(http, "GET", f"{DEPLOYS}/nope")
    assert status == 404
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'deployments.apps "nope" not found',
        "reason": "NotFound",
        "details": {"name": "nope", "group": "apps", "kind": "deployments"},
        "code": 404,
    }
    status, body = await call(
        http, "GET", "/apis/monitoring.coreos.com/v1/namespaces/default/servicemonitors"
    )
    assert status == 404
    assert body["reason"] == "NotFound"


async def test_generate_name_makes_unique_names(http: aiohttp.ClientSession) -> None:
    names = set()
    for _ in range(3):
        status, body = await call(http, "POST", CMS, {"metadata": {"generateName": "gen-"}})
        assert status == 201
        names.add(body["metadata"]["name"])
    assert len(names) == 3
    assert all(name.startswith("gen-") and len(name) == 9 for name in names)
    status, body = await call(http, "POST", CMS, {"metadata": {}})
    assert status == 422
    assert body["reason"] == "Invalid"


async def test_namespace_rules(http: aiohttp.ClientSession) -> None:
    status, body = await call(http, "POST", CMS, {"metadata": {"name": "x", "namespace": "other"}})
    assert status == 400
    assert "does not match the namespace" in body["message"]
    status, body = await call(http, "POST", "/api/v1/namespaces/ghost/configmaps", cm("x"))
    assert status == 404
    assert body["message"] == 'namespaces "ghost" not found'
    status, body = await call(http, "POST", "/api/v1/namespaces", {"metadata": {"name": "ghost"}})
    assert status == 201
    assert body["status"] == {"phase": "Active"}
    status, body = await call(http, "POST", "/api/v1/namespaces/ghost/configmaps", cm("x"))
    assert status == 201
    assert body["metadata"]["namespace"] == "ghost"


async def test_auto_create_namespaces_option() -> None:
    async with KubeEmulator(auto_create_namespaces=True) as emu:
        emu.create(cm("x"), namespace="fresh")
        assert emu.get("", "v1", "namespaces", "fresh") is not None


async def test_invalid_names_and_labels_are_422(http: aiohttp.ClientSession) -> None:
    status, body = await call(http, "POST", CMS, cm("Bad_Name"))
    assert status == 422
    assert body["details"]["causes"][0]["field"] == "metadata.name"
    assert body["message"].startswith(
        'ConfigMap "Bad_Name" is invalid: metadata.name: Invalid value'
    )
    status, body = await call(http, "POST", CMS, cm("ok", labels={"k": "x" * 64}))
    assert status == 422
    assert body["details"]["causes"][0]["field"] == "metadata.labels"


async def test_resource_version_is_global_and_monotonic(http: aiohttp.ClientSession) -> None:
    versions = []
    for path, body in [
        (CMS, cm("a")),
        (DEPLOYS, deployment("d")),
        (CMS, cm("b")),
        (WIDGETS, widget("w")),
    ]:
        status, created = await call(http, "POST", path, body)
        assert status == 201
        versions.append(int(created["metadata"]["resourceVersion"]))
    _, patched = await call(
        http, "PATCH", f"{CMS}/a", {"data": {"k": "v"}}, "application/merge-patch+json"
    )
    versions.append(int(patched["metadata"]["resourceVersion"]))
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)
    _, listing = await call(http, "GET", "/api/v1/configmaps")
    assert listing["metadata"]["resourceVersion"] == str(versions[-1])


# --- update / patch -------------------------------------------------------------------------


async def test_put_with_stale_resource_version_is_409_conflict(http: aiohttp.ClientSession) -> None:
    _, created = await call(http, "POST", CMS, cm("a", k="1"))
    status, updated = await call(http, "PUT", f"{CMS}/a", {**created, "data": {"k": "2"}})
    assert status == 200
    assert updated["data"] == {"k": "2"}
    status, body = await call(http, "PUT", f"{CMS}/a", {**created, "data": {"k": "3"}})
    assert status == 409
    assert body["reason"] == "Conflict"
    assert body["message"].startswith(
        'Operation cannot be fulfilled on configmaps "a": the object has been modified'
    )
    unconditional = {"metadata": {"name": "a"}, "data": {"k": "4"}}
    status, body = await call(http, "PUT", f"{CMS}/a", unconditional)
    assert status == 200
    assert body["data"] == {"k": "4"}
    assert body["metadata"]["uid"] == created["metadata"]["uid"]


async def test_merge_patch_follows_rfc7386(http: aiohttp.ClientSession) -> None:
    await call(http, "POST", CMS, cm("a", keep="1", drop="2"))
    patch = {"data": {"drop": None, "new": "3"}, "metadata": {"labels": {"l": "v"}}}
    status, body = await call(http, "PATCH", f"{CMS}/a", patch, "application/merge-patch+json")
    assert status == 200
    assert body["data"] == {"keep": "1", "new": "3"}
    assert body["metadata"]["labels"] == {"l": "v"}


async def test_merge_patch_with_stale_resource_version_conflicts(
    http: aiohttp.ClientSession,
) -> None:
    _, created = await call(http, "POST", CMS, cm("a"))
    await call(http, "PATCH", f"{CMS}/a", {"data": {"x": "1"}}, "application/merge-patch+json")
    stale = {
        "metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
        "data": {"x": "2"},
    }
    status, body = await call(http, "PATCH", f"{CMS}/a", stale, "application/merge-patch+json")
    assert status == 409
    assert body["reason"] == "Conflict"


async def test_json_patch_follows_rfc6902(http: aiohttp.ClientSession) -> None:
    _, created = await call(
        http, "POST", CMS, {**cm("a", k="1"), "metadata": {"name": "a", "finalizers": ["x/y"]}}
    )
    rv = created["metadata"]["resourceVersion"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/data/new", "value": "2"},
        {"op": "replace", "path": "/data/k", "value": "9"},
        {"op": "copy", "from": "/data/k", "path": "/data/copy"},
        {"op": "move", "from": "/data/new", "path": "/data/moved"},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]
    status, body = await call(http, "PATCH", f"{CMS}/a", ops, "application/json-patch+json")
    assert status == 200
    assert body["data"] == {"k": "9", "copy": "9", "moved": "2"}
    assert body["metadata"]["finalizers"] == []
    # Kopf's optimistic concurrency: a stale resourceVersion fails the `test` with 422.
    stale = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/data/z", "value": "1"},
    ]
    status, body = await call(http, "PATCH", f"{CMS}/a", stale, "application/json-patch+json")
    assert status == 422
    assert body["reason"] == "Invalid"
    _, after = await call(http, "GET", f"{CMS}/a")
    assert "z" not in after["data"]  # atomic: nothing from a failed patch is applied
    status, body = await call(
        http, "PATCH", f"{CMS}/a", {"data": {}}, "application/json-patch+json"
    )
    assert status == 400


async def test_strategic_merge_patch_merges_containers_by_name(http: aiohttp.ClientSession) -> None:
    await call(http, "POST", DEPLOYS, deployment("d"))
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "app", "image": "app:2", "env": [{"name": "B", "value": "2"}]}
                    ]
                }
            }
        },
        "metadata": {"finalizers": ["example.com/f"]},
    }
    status, body = await call(
        http, "PATCH", f"{DEPLOYS}/d", patch, "application/strategic-merge-patch+json"
    )
    assert status == 200
    containers = body["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["app", "sidecar"]
    assert containers[0]["image"] == "app:2"
    assert containers[0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    delete = {
        "spec": {"template": {"spec": {"containers": [{"name": "sidecar", "$patch": "delete"}]}}}
    }
    _, body = await call(
        http, "PATCH", f"{DEPLOYS}/d", delete, "application/strategic-merge-patch+json"
    )
    assert [c["name"] for c in body["spec"]["template"]["spec"]["containers"]] == ["app"]
    # Like the real server, custom resources do not support strategic merge-patch.
    await call(http, "POST", WIDGETS, widget("w", size=1))
    status, body = await call(
        http,
        "PATCH",
        f"{WIDGETS}/w",
        {"spec": {"size": 2}},
        "application/strategic-merge-patch+json",
    )
    assert status == 415
    assert body["reason"] == "UnsupportedMediaType"


async def test_server_side_apply_creates_then_updates(http: aiohttp.ClientSession) -> None:
    config = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\ndata:\n  k: v1\n"
    status, body = await call(
        http, "PATCH", f"{CMS}/applied", config, "application/apply-patch+yaml"
    )
    assert status == 400
    assert "fieldManager is required" in body["message"]
    status, body = await call(
        http, "PATCH", f"{CMS}/applied", config, "application/apply-patch+yaml", fieldManager="test"
    )
    assert status == 201
    assert body["data"] == {"k": "v1"}
    status, body = await call(
        http,
        "PATCH",
        f"{CMS}/applied",
        config.replace("v1", "v2"),
        "application/apply-patch+yaml",
        fieldManager="test",
    )
    assert status == 200
    assert body["data"] == {"k": "v2"}


async def test_noop_writes_do_not_bump_resource_version(
    emu: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    _, created = await call(http, "POST", CMS, cm("a", k="1"))
    before = emu.resource_version
    status, body = await call(
        http, "PATCH", f"{CMS}/a", {"data": {"k": "1"}}, "application/merge-patch+json"
    )
    assert status == 200
    assert body["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert emu.resource_version == before


async def test_generation_bumps_only_on_spec_changes(http: aiohttp.ClientSession) -> None:
    _, created = await call(http, "POST", WIDGETS, widget("w", size=1))
    assert created["metadata"]["generation"] == 1
    merge = "application/merge-patch+json"
    _, body = await call(http, "PATCH", f"{WIDGETS}/w", {"metadata": {"labels": {"a": "b"}}}, merge)
    assert body["metadata"]["generation"] == 1
    _, body = await call(
        http, "PATCH", f"{WIDGETS}/w/status", {"status": {"phase": "Ready"}}, merge
    )
    assert body["metadata"]["generation"] == 1
    _, body = await call(http, "PATCH", f"{WIDGETS}/w", {"spec": {"size": 2}}, merge)
    assert body["metadata"]["generation"] == 2
    await call(http, "POST", DEPLOYS, deployment("d"))
    _, body = await call(http, "PATCH", f"{DEPLOYS}/d/status", {"status": {"replicas": 1}}, merge)
    assert body["metadata"]["generation"] == 1
    _, body = await call(http, "PATCH", f"{DEPLOYS}/d", {"spec": {"replicas": 3}}, merge)
    assert body["metadata"]["generation"] == 2


async def test_status_subresource_split(http: aiohttp.ClientSession) -> None:
    merge = "application/merge-patch+json"
    _, created = await call(
        http, "POST", WIDGETS, {**widget("w", size=1), "status": {"phase": "Fake"}}
    )
    assert "status" not in created  # status is dropped on create
    _, body = await call(
        http, "PATCH", f"{WIDGETS}/w", {"spec": {"size": 2}, "status": {"phase": "X"}}, merge
    )
    assert body["spec"]["size"] == 2
    assert "status" not in body
    _, body = await call(
        http,
        "PATCH",
        f"{WIDGETS}/w/status",
        {"spec": {"size": 9}, "status": {"phase": "Ready"}},
        merge,
    )
    assert body["spec"]["size"] == 2
    assert body["status"] == {"phase": "Ready"}
    status, body = await call(
        http, "PUT", f"{WIDGETS}/w/status", {**body, "status": {"phase": "Done"}}
    )
    assert status == 200
    assert body["status"] == {"phase": "Done"}
    # Built-ins: apps/v1 Deployment has a status subresource too.
    await call(http, "POST", DEPLOYS, deployment("d"))
    _, body = await call(http, "PATCH", f"{DEPLOYS}/d", {"status": {"replicas": 5}}, merge)
    assert body.get("status", {}).get("replicas") is None
    _, body = await call(
        http, "PATCH", f"{DEPLOYS}/d/status", {"status": {"readyReplicas": 1}}, merge
    )
    assert body["status"]["readyReplicas"] == 1
    status, _ = await call(http, "GET", f"{CMS}/whatever/status")
    assert status == 404  # configmaps have no status subresource


async def test_scale_subresource(http: aiohttp.ClientSession) -> None:
    await call(http, "POST", DEPLOYS, deployment("d", replicas=2))
    status, scale = await call(http, "GET", f"{DEPLOYS}/d/scale")
    assert status == 200
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 2
    assert scale["status"]["selector"] == "app=d"
    _, scale = await call(
        http,
        "PATCH",
        f"{DEPLOYS}/d/scale",
        {"spec": {"replicas": 4}},
        "application/merge-patch+json",
    )
    assert scale["spec"]["replicas"] == 4
    _, body = await call(http, "GET", f"{DEPLOYS}/d")
    assert body["spec"]["replicas"] == 4


# --- deletion ----------------------------------------------------------------------------------


async def test_finalizers_block_deletion_until_removed(http: aiohttp.ClientSession) -> None:
    body = cm("a")
    body["metadata"]["finalizers"] = ["example.com/cleanup"]
    _, created = await call(http, "POST", CMS, body)
    watch = await open_watch(http, CMS, resourceVersion=created["metadata"]["resourceVersion"])
    status, deleting = await call(http, "DELETE", f"{CMS}/a")
    assert status == 200
    assert deleting["kind"] == "ConfigMap"
    assert deleting["metadata"]["deletionTimestamp"]
    assert deleting["metadata"]["deletionGracePeriodSeconds"] == 0
    assert deleting["metadata"]["generation"] == 2
    status, again = await call(http, "DELETE", f"{CMS}/a")
    assert status == 200
    assert again["metadata"]["resourceVersion"] == deleting["metadata"]["resourceVersion"]
    status, body = await call(
        http,
        "PATCH",
        f"{CMS}/a",
        {"metadata": {"finalizers": ["example.com/cleanup", "b/c"]}},
        "application/merge-patch+json",
    )
    assert status == 422
    assert "no new finalizers" in body["message"]
    status, released = await call(
        http,
        "PATCH",
        f"{CMS}/a",
        {"metadata": {"finalizers": None}},
        "application/merge-patch+json",
    )
    assert status == 200
    assert "finalizers" not in released["metadata"]
    status, _ = await call(http, "GET", f"{CMS}/a")
    assert status == 404
    assert await watch.take(2) == [("MODIFIED", "a"), ("DELETED", "a")]


async def test_delete_answers_status_for_builtins_and_object_for_custom_resources(
    http: aiohttp.ClientSession,
) -> None:
    _, created = await call(http, "POST", CMS, cm("a"))
    status, body = await call(http, "DELETE", f"{CMS}/a")
    assert status == 200
    assert body["kind"] == "Status"
    assert body["status"] == "Success"
    assert body["details"] == {"name": "a", "kind": "configmaps", "uid": created["metadata"]["uid"]}
    await call(http, "POST", WIDGETS, widget("w"))
    status, body = await call(http, "DELETE", f"{WIDGETS}/w")
    assert status == 200
    assert body["kind"] == "Widget"
    status, body = await call(http, "DELETE", f"{WIDGETS}/w")
    assert status == 404


async def test_delete_preconditions(http: aiohttp.ClientSession) -> None:
    await call(http, "POST", CMS, cm("a"))
    options = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "not-the-uid"}}
    status, body = await call(http, "DELETE", f"{CMS}/a", options)
    assert status == 409
    assert "Precondition failed" in body["message"]


def owned(name: str, *owners: dict[str, Any]) -> dict[str, Any]:
    body = cm(name)
    body["metadata"]["ownerReferences"] = [
        {
            "apiVersion": o["apiVersion"],
            "kind": o["kind"],
            "name": o["metadata"]["name"],
            "uid": o["metadata"]["uid"],
            "controller": False,
            "blockOwnerDeletion": True,
        }
        for o in owners
    ]
    return body


async def test_garbage_collection_cascades_in_background(
    emu: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    _, owner = await call(http, "POST", WIDGETS, widget("owner"))
    _, other = await call(http, "POST", WIDGETS, widget("other"))
    await call(http, "POST", CMS, owned("child", owner))
    await call(http, "POST", CMS, owned("shared", owner, other))
    finalized = owned("finalized", owner)
    finalized["metadata"]["finalizers"] = ["example.com/f"]
    await call(http, "POST", CMS, finalized)
    _, grandchild_owner = await call(http, "GET", f"{CMS}/child")
    await call(http, "POST", CMS, owned("grandchild", grandchild_owner))

    await call(http, "DELETE", f"{WIDGETS}/owner")
    assert emu.get("", "v1", "configmaps", "child", "default") is None
    assert emu.get("", "v1", "configmaps", "grandchild", "default") is None
    shared = emu.get("", "v1", "configmaps", "shared", "default")
    assert shared is not None
    assert [r["name"] for r in shared["metadata"]["ownerReferences"]] == ["other"]
    finalizing = emu.get("", "v1", "configmaps", "finalized", "default")
    assert finalizing is not None
    assert finalizing["metadata"]["deletionTimestamp"]


async def test_garbage_collection_foreground_and_orphan(
    emu: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    _, owner = await call(http, "POST", WIDGETS, widget("fg"))
    blocker = owned("blocker", owner)
    blocker["metadata"]["finalizers"] = ["example.com/f"]
    await call(http, "POST", CMS, blocker)
    status, body = await call(http, "DELETE", f"{WIDGETS}/fg", {"propagationPolicy": "Foreground"})
    assert status == 200
    assert body["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert emu.get(GROUP, "v1", "widgets", "fg", "default") is not None  # waits for its dependents
    await call(
        http,
        "PATCH",
        f"{CMS}/blocker",
        {"metadata": {"finalizers": []}},
        "application/merge-patch+json",
    )
    assert emu.get("", "v1", "configmaps", "blocker", "default") is None
    assert emu.get(GROUP, "v1", "widgets", "fg", "default") is None

    _, owner = await call(http, "POST", WIDGETS, widget("orphaner"))
    await call(http, "POST", CMS, owned("orphan", owner))
    await call(http, "DELETE", f"{WIDGETS}/orphaner", propagationPolicy="Orphan")
    orphan = emu.get("", "v1", "configmaps", "orphan", "default")
    assert orphan is not None
    assert "ownerReferences" not in orphan["metadata"]


async def test_objects_with_nonexistent_owners_are_collected(
    emu: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    fake_owner = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "ghost", "uid": "no-such-uid"},
    }
    status, _ = await call(http, "POST", CMS, owned("dangling", fake_owner))
    assert status == 201
    await emu.wait_for(
        lambda: emu.get("", "v1", "configmaps", "dangling", "default") is None, timeout=2
    )


async def test_namespace_deletion_removes_contents(
    emu: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    await call(http, "POST", "/api/v1/namespaces", {"metadata": {"name": "doomed"}})
    held = cm("held")
    held["metadata"]["finalizers"] = ["example.com/f"]
    await call(http, "POST", "/api/v1/namespaces/doomed/configmaps", held)
    await call(http, "POST", "/api/v1/namespaces/doomed/configmaps", cm("plain"))
    status, body = await call(http, "DELETE", "/api/v1/namespaces/doomed")
    assert status == 200
    assert body["status"]["phase"] == "Terminating"
    assert emu.get("", "v1", "configmaps", "plain", "doomed") is None
    status, body = await call(http, "POST", "/api/v1/namespaces/doomed/configmaps", cm("late"))
    assert status == 403
    assert "being terminated" in body["message"]
    await call(
        http,
        "PATCH",
        "/api/v1/namespaces/doomed/configmaps/held",
        {"metadata": {"finalizers": None}},
        "application/merge-patch+json",
    )
    assert emu.get("", "v1", "namespaces", "doomed") is None


# --- lists & selectors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", ["a", "b"]),
        ("app==web", ["a", "b"]),
        ("app!=web", ["c", "d"]),
        ("app in (web,db)", ["a", "b", "c"]),
        ("app notin (web)", ["c", "d"]),
        ("tier", ["a", "c"]),
        ("!tier", ["b", "d"]),
        ("app=web,tier=front", ["a"]),
        ("app in (web, db),!tier", ["b"]),
    ],
)
async def test_label_selectors_on_list(
    http: aiohttp.ClientSession, selector: str, expected: list[str]
) -> None:
    for name, labels in [
        ("a", {"app": "web", "tier": "front"}),
        ("b", {"app": "web"}),
        ("c", {"app": "db", "tier": "back"}),
        ("d", {}),
    ]:
        await call(http, "POST", CMS, cm(name, labels=labels))
    status, listing = await call(http, "GET", CMS, labelSelector=selector)
    assert status == 200
    assert [item["metadata"]["name"] for item in listing["items"]] == expected


async def test_field_selectors_and_bad_selectors(http: aiohttp.ClientSession) -> None:
    await call(http, "POST", CMS, cm("a"))
    await call(http, "POST", CMS, cm("b"))
    _, listing = await call(http, "GET", "/api/v1/configmaps", fieldSelector="metadata.name=b")
    assert [i["metadata"]["name"] for i in listing["items"]] == ["b"]
    _, listing = await call(
        http,
        "GET",
        "/api/v1/configmaps",
        fieldSelector="metadata.namespace==default,metadata.name!=b",
    )
    assert [i["metadata"]["name"] for i in listing["items"]] == ["a"]
    status, body = await call(http, "GET", CMS, labelSelector="app in (web")
    assert status == 400
    assert body["reason"] == "BadRequest"


async def test_lists_cluster_wide_and_namespaced_with_paging(http: aiohttp.ClientSession) -> None:
    await call(http, "POST", "/api/v1/namespaces", {"metadata": {"name": "other"}})
    for ns in ("default", "other"):
        for name in ("d1", "d2"):
            await call(http, "POST", f"/apis/apps/v1/namespaces/{ns}/deployments", deployment(name))
    _, listing = await call(http, "GET", "/apis/apps/v1/deployments")
    assert listing["kind"] == "DeploymentList"
    assert listing["apiVersion"] == "apps/v1"
    assert [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in listing["items"]] == [
        ("default", "d1"),
        ("default", "d2"),
        ("other", "d1"),
        ("other", "d2"),
    ]
    assert "kind" not in listing["items"][0]  # like typed lists of the real server
    _, listing = await call(http, "GET", "/apis/apps/v1/namespaces/other/deployments")
    assert [i["metadata"]["name"] for i in listing["items"]] == ["d1", "d2"]
    _, page = await call(http, "GET", "/apis/apps/v1/deployments", limit="3")
    assert len(page["items"]) == 3
    assert page["metadata"]["remainingItemCount"] == 1
    _, rest = await call(
        http,
        "GET",
        "/apis/apps/v1/deployments",
        limit="3",
        **{"continue": page["metadata"]["continue"]},
    )
    assert [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in rest["items"]] == [
        ("other", "d2")
    ]
    assert "continue" not in rest["metadata"]


# --- watches -----------------------------------------------------------------------------------


async def test_watch_from_scratch_lists_current_objects_then_follows(
    http: aiohttp.ClientSession,
) -> None:
    await call(http, "POST", CMS, cm("old"))
    watch = await open_watch(http, CMS)
    assert await watch.take(1) == [("ADDED", "old")]
    await call(http, "POST", CMS, cm("new"))
    await call(http, "PATCH", f"{CMS}/new", {"data": {"x": "1"}}, "application/merge-patch+json")
    await call(http, "DELETE", f"{CMS}/old")
    assert await watch.take(3) == [("ADDED", "new"), ("MODIFIED", "new"), ("DELETED", "old")]


async def test_watch_resumes_after_resource_version(http: aiohttp.ClientSession) -> None:
    _, first = await call(http, "POST", CMS, cm("a"))
    await call(http, "POST", CMS, cm("b"))
    await call(http, "PATCH", f"{CMS}/a", {"data": {"x": "1"}}, "application/merge-patch+json")
    await call(http, "POST", WIDGETS, widget("w"))  # other kinds never leak into the stream
    watch = await open_watch(http, CMS, resourceVersion=first["metadata"]["resourceVersion"])
    assert await watch.take(2) == [("ADDED", "b"), ("MODIFIED", "a")]
    await call(http, "POST", CMS, cm("c"))
    assert await watch.take(1) == [("ADDED", "c")]


async def test_watch_honours_timeout_seconds(http: aiohttp.ClientSession) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with http.get(
        CMS, params={"watch": "true", "timeoutSeconds": "1", "resourceVersion": "1"}
    ) as response:
        body = await asyncio.wait_for(response.read(), timeout=5)
    elapsed = loop.time() - started
    assert 0.9 <= elapsed < 3
    assert body == b""


async def test_watch_label_selector_transitions(http: aiohttp.ClientSession) -> None:
    merge = "application/merge-patch+json"
    await call(http, "POST", CMS, cm("a", labels={"app": "web"}))
    await call(http, "POST", CMS, cm("b", labels={"app": "db"}))
    watch = await open_watch(http, CMS, labelSelector="app=web")
    assert await watch.take(1) == [("ADDED", "a")]
    await call(
        http, "PATCH", f"{CMS}/b", {"metadata": {"labels": {"app": "web"}}}, merge
    )  # starts matching
    await call(
        http, "PATCH", f"{CMS}/a", {"metadata": {"labels": {"app": "db"}}}, merge
    )  # stops matching
    await call(http, "PATCH", f"{CMS}/a", {"data": {"x": "1"}}, merge)  # irrelevant now
    await call(http, "PATCH", f"{CMS}/b", {"data": {"x": "1"}}, merge)
    assert await watch.take(3) == [("ADDED", "b"), ("DELETED", "a"), ("MODIFIED", "b")]


async def test_watch_bookmarks_and_initial_events_end(
    emu: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    await call(http, "POST", CMS, cm("a"))
    watch = await open_watch(
        http,
        CMS,
        allowWatchBookmarks="true",
        sendInitialEvents="true",
        resourceVersionMatch="NotOlderThan",
    )
    added = await watch.next()
    initial_end = await watch.next()
    assert added["type"] == "ADDED"
    assert initial_end["type"] == "BOOKMARK"
    assert initial_end["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    periodic = await watch.next(timeout=2)
    assert periodic["type"] == "BOOKMARK"
    assert periodic["object"]["metadata"]["resourceVersion"] == str(emu.resource_version)
    no_bookmarks = await open_watch(http, CMS)
    await call(http, "POST", CMS, cm("b"))
    assert await no_bookmarks.take(2, skip_bookmarks=False) == [("ADDED", "a"), ("ADDED", "b")]


async def test_watch_from_compacted_version_is_410_gone(
    emu: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    _, created = await call(http, "POST", CMS, cm("a"))
    await call(http, "POST", CMS, cm("b"))
    emu.compact()
    watch = await open_watch(http, CMS, resourceVersion=created["metadata"]["resourceVersion"])
    event = await watch.next()
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410
    assert event["object"]["reason"] == "Expired"


# --- discovery & CRDs ----------------------------------------------------------------------------


async def test_discovery_lists_builtins_kopf_and_helm_need(http: aiohttp.ClientSession) -> None:
    _, core = await call(http, "GET", "/api/v1")
    names = {r["name"] for r in core["resources"]}
    assert {
        "namespaces",
        "configmaps",
        "services",
        "secrets",
        "serviceaccounts",
        "events",
        "pods",
        "namespaces/status",
        "pods/status",
    } <= names
    _, api = await call(http, "GET", "/api")
    assert api["versions"] == ["v1"]
    _, groups = await call(http, "GET", "/apis")
    group_names = {g["name"] for g in groups["groups"]}
    assert {
        "apps",
        "rbac.authorization.k8s.io",
        "apiextensions.k8s.io",
        "events.k8s.io",
        "coordination.k8s.io",
        GROUP,
    } <= group_names
    assert "monitoring.coreos.com" not in group_names
    _, apps = await call(http, "GET", "/apis/apps/v1")
    deploy = next(r for r in apps["resources"] if r["name"] == "deployments")
    assert deploy["kind"] == "Deployment"
    assert deploy["namespaced"]
    assert "deploy" in deploy["shortNames"]
    assert {"deployments/status", "deployments/scale"} <= {r["name"] for r in apps["resources"]}
    _, rbac = await call(http, "GET", "/apis/rbac.authorization.k8s.io/v1")
    assert {r["name"]: r["namespaced"] for r in rbac["resources"]} == {
        "roles": True,
        "rolebindings": True,
        "clusterroles": False,
        "clusterrolebindings": False,
    }
    _, group = await call(http, "GET", "/apis/apps")
    assert group["preferredVersion"] == {"groupVersion": "apps/v1", "version": "v1"}
    status, _ = await call(http, "GET", "/apis/monitoring.coreos.com/v1")
    assert status == 404
    status, version = await call(http, "GET", "/version")
    assert status == 200
    assert version["major"] == "1"


async def test_crd_creation_makes_the_kind_servable(
    emu: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    crd = crd_manifest(
        "other.fleetwarden.dev",
        "Gadget",
        scope="Cluster",
        short_names=("gd",),
        versions=("v1", "v1beta1"),
    )
    status, created = await call(
        http, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd
    )
    assert status == 201
    conditions = {c["type"]: c["status"] for c in created["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}
    _, group = await call(http, "GET", "/apis/other.fleetwarden.dev")
    assert group["preferredVersion"]["version"] == "v1"
    _, resources = await call(http, "GET", "/apis/other.fleetwarden.dev/v1")
    gadgets = next(r for r in resources["resources"] if r["name"] == "gadgets")
    assert gadgets == {
        "name": "gadgets",
        "singularName": "gadget",
        "namespaced": False,
        "kind": "Gadget",
        "verbs": [
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ],
        "shortNames": ["gd"],
    }
    assert "gadgets/status" in {r["name"] for r in resources["resources"]}
    gadget = {"apiVersion": "other.fleetwarden.dev/v1", "kind": "Gadget", "metadata": {"name": "g"}}
    status, body = await call(http, "POST", "/apis/other.fleetwarden.dev/v1/gadgets", gadget)
    assert status == 201
    assert "namespace" not in body["metadata"]
    # Versions share storage (conversion strategy None): the same object, another apiVersion.
    _, other_version = await call(http, "GET", "/apis/other.fleetwarden.dev/v1beta1/gadgets/g")
    assert other_version["apiVersion"] == "other.fleetwarden.dev/v1beta1"
    assert other_version["metadata"]["uid"] == body["metadata"]["uid"]
    status, _ = await call(
        http,
        "DELETE",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gadgets.other.fleetwarden.dev",
    )
    assert status == 200
    status, _ = await call(http, "GET", "/apis/other.fleetwarden.dev/v1/gadgets")
    assert status == 404
    _, groups = await call(http, "GET", "/apis")
    assert "other.fleetwarden.dev" not in {g["name"] for g in groups["groups"]}


async def test_crd_name_must_match_its_names(http: aiohttp.ClientSession) -> None:
    crd = crd_manifest("x.fleetwarden.dev", "Thing")
    crd["metadata"]["name"] = "wrong.x.fleetwarden.dev"
    status, body = await call(
        http, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd
    )
    assert status == 422
    assert body["details"]["kind"] == "CustomResourceDefinition"


async def test_custom_resources_are_pruned_and_validated(http: aiohttp.ClientSession) -> None:
    body = widget("w", size=1, unknown="dropped", extra={"anything": {"goes": True}})
    status, created = await call(http, "POST", WIDGETS, body)
    assert status == 201
    assert created["spec"] == {"size": 1, "extra": {"anything": {"goes": True}}}
    status, error = await call(http, "POST", WIDGETS, widget("bad", size="big", mode="medium"))
    assert status == 422
    assert {c["field"] for c in error["details"]["causes"]} == {"spec.size", "spec.mode"}
    status, error = await call(
        http, "PATCH", f"{WIDGETS}/w", {"spec": {"size": -1}}, "application/merge-patch+json"
    )
    assert status == 422
    assert error["details"]["causes"][0]["field"] == "spec.size"


# --- clients ---------------------------------------------------------------------------------------


async def test_kubernetes_aio_client_round_trip(emu: KubeEmulator, tmp_path: pathlib.Path) -> None:
    from kubernetes.aio import client, config

    kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
    api_client = await config.new_client_from_config(config_file=str(kubeconfig))
    async with api_client:
        apps = client.AppsV1Api(api_client)
        created = await apps.create_namespaced_deployment("default", deployment("web"))
        assert created.metadata.uid
        assert created.metadata.generation == 1
        read = await apps.read_namespaced_deployment("web", "default")
        assert read.spec.replicas == 1
        mark = emu.mark()
        patched = await apps.patch_namespaced_deployment(
            "web", "default", {"spec": {"replicas": 3}}
        )
        assert patched.spec.replicas == 3
        assert patched.metadata.generation == 2
        # Dict bodies go out as strategic-merge-patch (list bodies as json-patch).
        assert emu.requests[mark].content_type == "application/strategic-merge-patch+json"
        status = await apps.patch_namespaced_deployment_status(
            "web", "default", {"status": {"replicas": 3}}
        )
        assert status.status.replicas == 3
        listed = await apps.list_deployment_for_all_namespaces(label_selector="missing=label")
        assert listed.items == []
        deleted = await apps.delete_namespaced_deployment("web", "default")
        assert deleted["kind"] == "Status"
        assert deleted["status"] == "Success"
        assert emu.get("apps", "v1", "deployments", "web", "default") is None

        custom = client.CustomObjectsApi(api_client)
        await custom.create_namespaced_custom_object(
            GROUP, "v1", "default", "widgets", widget("w", size=1)
        )
        mark = emu.mark()
        patched_widget = await custom.patch_namespaced_custom_object(
            GROUP, "v1", "default", "widgets", "w", {"spec": {"size": 2}}
        )
        assert patched_widget["spec"]["size"] == 2
        assert emu.requests[mark].content_type == "application/merge-patch+json"
        core = client.CoreV1Api(api_client)
        with pytest.raises(client.ApiException) as raised:
            await core.read_namespaced_config_map("absent", "default")
        assert raised.value.status == 404


# --- test-side helpers -------------------------------------------------------------------------------


async def test_write_log_and_kmock_views(emu: KubeEmulator, http: aiohttp.ClientSession) -> None:
    mark = emu.mark()
    await call(http, "GET", CMS)
    assert emu.writes_since(mark) == []
    await call(http, "POST", CMS, cm("a"))
    await call(http, "PATCH", f"{CMS}/a", {"data": {"k": "v"}}, "application/merge-patch+json")
    assert emu.writes_since(mark) == [("POST", CMS), ("PATCH", f"{CMS}/a")]
    assert len(emu["patch"]) == 1  # kmock's request DSL still works
    history = emu.objects["v1/configmaps", "default", "a"].history
    assert len(history) == 2
    assert history[-1] >= {"data": {"k": "v"}}


async def test_kmock_reactions_override_the_emulation(
    emu: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    emu[f"get {CMS}/flaky"] << 503
    status, _ = await call(http, "GET", f"{CMS}/flaky")
    assert status == 503
    status, body = await call(http, "GET", f"{CMS}/other")
    assert status == 404
    assert body["reason"] == "NotFound"


async def test_secret_string_data_is_merged_into_data(http: aiohttp.ClientSession) -> None:
    secret = {
        "metadata": {"name": "s"},
        "stringData": {"password": "hunter2"},
        "data": {"a": "Yg=="},
    }
    _, body = await call(http, "POST", "/api/v1/namespaces/default/secrets", secret)
    assert body["data"] == {"a": "Yg==", "password": "aHVudGVyMg=="}
    assert "stringData" not in body
