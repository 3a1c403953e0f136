"""Kopf end to end on the emulator: handlers, finalizers, status, children, GC, peering.

This proves the emulator is faithful enough for the operator's own tests:
Kopf's discovery, list+watch, merge-patches, JSON-patches guarded by
``resourceVersion``, status-subresource patches and finalizers all work, and
the garbage collector removes the operator's children like a real cluster.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from kubernetes.aio import client, config

from tests.support.kopf_runner import _is_kopf_task, run_kopf
from tests.support.kube_emulator import KubeEmulator
from tests.support.kube_resources import crd_manifest

GROUP = "test.fleetwarden.dev"
FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


@pytest.fixture
async def emu() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as emulator:
        await emulator.apply_crd(crd_manifest(GROUP, "Widget"))
        yield emulator


@pytest.fixture
async def api(emu: KubeEmulator, tmp_path: pathlib.Path) -> AsyncIterator[client.ApiClient]:
    kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
    api_client = await config.new_client_from_config(config_file=str(kubeconfig))
    async with api_client:
        yield api_client


def quiet_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.posting.level = logging.WARNING  # fewer k8s Events posted per handler run
    return settings


def widget_registry(api: client.ApiClient, calls: list[tuple[str, Any]]) -> kopf.OperatorRegistry:
    """A tiny operator: each Widget owns a ConfigMap mirroring ``spec.size``."""
    registry = kopf.OperatorRegistry()
    core = client.CoreV1Api(api)

    @kopf.on.create(GROUP, "v1", "widgets", registry=registry, id="reconcile")
    @kopf.on.update(GROUP, "v1", "widgets", registry=registry, id="reconcile")
    async def reconcile(
        spec: kopf.Spec,
        name: str,
        namespace: str,
        body: kopf.Body,
        patch: kopf.Patch,
        reason: str,
        **_: Any,
    ) -> dict[str, Any]:
        calls.append((reason, spec["size"]))
        child = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-config"},
            "data": {"size": str(spec["size"])},
        }
        kopf.adopt(child, owner=body)
        try:
            await core.create_namespaced_config_map(namespace, child)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
            await core.patch_namespaced_config_map(
                f"{name}-config", namespace, {"data": child["data"]}
            )
        patch.status["observedSize"] = spec["size"]
        patch.status["observedGeneration"] = body.metadata.get("generation")
        return {"child": f"{name}-config"}

    @kopf.on.delete(GROUP, "v1", "widgets", registry=registry, id="cleanup")
    async def cleanup(name: str, **_: Any) -> None:
        calls.append(("delete", name))

    return registry


async def test_widget_lifecycle_with_child_status_finalizer_and_gc(
    emu: KubeEmulator, api: client.ApiClient
) -> None:
    calls: list[tuple[str, Any]] = []
    registry = widget_registry(api, calls)
    custom = client.CustomObjectsApi(api)

    def widget() -> dict[str, Any] | None:
        return emu.get(GROUP, "v1", "widgets", "w1", "default")

    def child() -> dict[str, Any] | None:
        return emu.get("", "v1", "configmaps", "w1-config", "default")

    async with run_kopf(emu, registry=registry, settings=quiet_settings(), namespaces=["default"]):
        body = {
            "apiVersion": f"{GROUP}/v1",
            "kind": "Widget",
            "metadata": {"name": "w1"},
            "spec": {"size": 3},
        }
        await custom.create_namespaced_custom_object(GROUP, "v1", "default", "widgets", body)

        created = await emu.wait_for(
            lambda: (w := widget()) and w.get("status", {}).get("observedSize") == 3 and w
        )
        assert created["metadata"]["finalizers"] == [FINALIZER]
        assert created["status"]["observedGeneration"] == 1
        assert created["status"]["reconcile"] == {
            "child": "w1-config"
        }  # Kopf stores handler results
        progress = created["metadata"]["annotations"]
        assert "kopf.zalando.org/last-handled-configuration" in progress
        configmap = child()
        assert configmap is not None
        assert configmap["data"] == {"size": "3"}
        owner_ref = configmap["metadata"]["ownerReferences"][0]
        assert owner_ref["uid"] == created["metadata"]["uid"]
        assert owner_ref["controller"] is True

        await custom.patch_namespaced_custom_object(
            GROUP, "v1", "default", "widgets", "w1", {"spec": {"size": 5}}
        )
        updated = await emu.wait_for(
            lambda: (w := widget()) and w.get("status", {}).get("observedSize") == 5 and w
        )
        assert updated["metadata"]["generation"] == 2
        assert updated["status"]["observedGeneration"] == 2
        assert (child() or {}).get("data") == {"size": "5"}

        await custom.delete_namespaced_custom_object(GROUP, "v1", "default", "widgets", "w1")
        await emu.wait_for(lambda: widget() is None and child() is None)

    assert calls == [("create", 3), ("update", 5), ("delete", "w1")]
    assert not emu.internal_errors
    # Kopf released the object by removing its finalizer with a resourceVersion-guarded JSON-patch.
    json_patches = [r for r in emu.requests if r.content_type == "application/json-patch+json"]
    assert json_patches
    assert all(
        r.body[0]["op"] == "test" and r.body[0]["path"] == "/metadata/resourceVersion"
        for r in json_patches
    )


async def test_operator_is_idle_once_settled(emu: KubeEmulator, api: client.ApiClient) -> None:
    calls: list[tuple[str, Any]] = []
    registry = widget_registry(api, calls)
    async with run_kopf(emu, registry=registry, settings=quiet_settings(), clusterwide=True):
        emu.create(
            {
                "apiVersion": f"{GROUP}/v1",
                "kind": "Widget",
                "metadata": {"name": "w"},
                "spec": {"size": 1},
            }
        )
        await emu.wait_for(
            lambda: (
                (emu.get(GROUP, "v1", "widgets", "w", "default") or {})
                .get("status", {})
                .get("observedSize")
                == 1
            )
        )
        mark = emu.mark()
        resource_version = emu.resource_version
        # Nothing changed: a resync-free operator must not write again. A bounded negative check.
        with pytest.raises(TimeoutError):
            await emu.wait_for(lambda: emu.writes_since(mark), timeout=0.5)
        assert emu.resource_version == resource_version
    assert calls == [("create", 1)]


async def test_peering_pauses_and_resumes(
    emu: KubeEmulator, api: client.ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kopf")
    peering_crd = crd_manifest(
        "kopf.dev",
        "ClusterKopfPeering",
        "clusterkopfpeerings",
        scope="Cluster",
        status_subresource=False,
    )
    await emu.apply_crd(peering_crd)
    emu.create(
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "fw-test"}}
    )
    calls: list[tuple[str, Any]] = []
    registry = widget_registry(api, calls)
    custom = client.CustomObjectsApi(api)

    def peers() -> dict[str, Any]:
        status: dict[str, Any] = (
            emu.get("kopf.dev", "v1", "clusterkopfpeerings", "fw-test") or {}
        ).get("status", {})
        return status

    def handled(name: str) -> bool:
        status = (emu.get(GROUP, "v1", "widgets", name, "default") or {}).get("status", {})
        return "observedSize" in status

    async with run_kopf(
        emu,
        registry=registry,
        settings=quiet_settings(),
        clusterwide=True,
        peering_name="fw-test",
        standalone=False,
    ):
        await emu.wait_for(lambda: len(peers()) == 1)
        ((identity, info),) = peers().items()
        assert info["priority"] == 0
        assert info["lifetime"] == 60

        emu.create(
            {
                "apiVersion": f"{GROUP}/v1",
                "kind": "Widget",
                "metadata": {"name": "a"},
                "spec": {"size": 1},
            }
        )
        await emu.wait_for(lambda: handled("a"))

        now = datetime.datetime.now(datetime.UTC).isoformat()
        rival = {"status": {"rival-operator": {"priority": 100, "lifetime": 60, "lastseen": now}}}
        await custom.patch_cluster_custom_object(
            "kopf.dev", "v1", "clusterkopfpeerings", "fw-test", rival
        )
        await emu.wait_for(lambda: "Pausing operations in favour of" in caplog.text)
        emu.create(
            {
                "apiVersion": f"{GROUP}/v1",
                "kind": "Widget",
                "metadata": {"name": "b"},
                "spec": {"size": 2},
            }
        )
        with pytest.raises(TimeoutError):
            await emu.wait_for(lambda: handled("b"), timeout=0.5)

        await custom.patch_cluster_custom_object(
            "kopf.dev", "v1", "clusterkopfpeerings", "fw-test", {"status": {"rival-operator": None}}
        )
        await emu.wait_for(lambda: handled("b"))
        assert "Resuming operations after the pause" in caplog.text

    # On a clean exit, Kopf removes itself from the peering object.
    await emu.wait_for(lambda: identity not in peers())
    assert [reason for reason, _ in calls] == ["create", "create"]


async def test_runner_leaves_callers_tasks_alone(emu: KubeEmulator, api: client.ApiClient) -> None:
    background = asyncio.create_task(asyncio.Event().wait(), name="the test's own task")
    registry = widget_registry(api, [])
    async with run_kopf(
        emu, registry=registry, settings=quiet_settings(), clusterwide=True
    ) as handle:
        assert handle.ready_flag.is_set()
    assert all(task.done() for task in handle.tasks)
    assert [
        task for task in asyncio.all_tasks() if _is_kopf_task(task)
    ] == []  # no stragglers either
    assert not background.done()  # kopf.operator() would have cancelled it here
    background.cancel()
