"""Helm (helm-python-sdk, i.e. Helm v4's Go SDK) installs and uninstalls charts on the emulator.

Helm is the strictest client in this repository: it does discovery, checks
``/openapi/v3`` for server-side field validation, creates objects with
server-side apply, and keeps its release records as labelled Secrets written
with protobuf bodies. If this passes, the chart's install path is exercised
against realistic API semantics.
"""

from __future__ import annotations

import base64
import gzip
import json
import pathlib
from collections.abc import AsyncIterator

import pytest

from tests.support.helm_install import install_chart, list_releases, uninstall_chart, upgrade_chart
from tests.support.kube_emulator import KubeEmulator

CHART = pathlib.Path(__file__).parent / "fixtures" / "tinychart"


@pytest.fixture
async def emu() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as emulator:
        yield emulator


async def test_install_upgrade_uninstall_tiny_chart(
    emu: KubeEmulator, tmp_path: pathlib.Path
) -> None:
    kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")

    release = await install_chart(
        CHART, "demo", "default", {"greeting": "hi", "replicas": 2}, kubeconfig
    )
    assert release["status"] == "deployed"
    assert release["revision"] == 1

    configmap = emu.get("", "v1", "configmaps", "demo-config", "default")
    assert configmap is not None
    assert configmap["data"] == {"greeting": "hi"}
    assert configmap["metadata"]["labels"]["app.kubernetes.io/instance"] == "demo"
    deployment = emu.get("apps", "v1", "deployments", "demo-app", "default")
    assert deployment is not None
    assert deployment["spec"]["replicas"] == 2
    assert deployment["metadata"]["generation"] == 1

    # The release record: a Secret found by label selector, with the gzipped release inside.
    records = emu.list("", "v1", "secrets", "default", label_selector="owner=helm,name=demo")
    assert [r["metadata"]["name"] for r in records] == ["sh.helm.release.v1.demo.v1"]
    assert records[0]["type"] == "helm.sh/release.v1"
    assert records[0]["metadata"]["labels"]["status"] == "deployed"
    stored = json.loads(
        gzip.decompress(base64.b64decode(base64.b64decode(records[0]["data"]["release"])))
    )
    assert stored["name"] == "demo"
    assert stored["config"] == {"greeting": "hi", "replicas": 2}

    # Helm created the objects with server-side apply.
    applies = [r for r in emu.requests if r.content_type == "application/apply-patch+yaml"]
    assert {r.path for r in applies} == {
        "/api/v1/namespaces/default/configmaps/demo-config",
        "/apis/apps/v1/namespaces/default/deployments/demo-app",
    }

    upgraded = await upgrade_chart(
        CHART, "demo", "default", {"greeting": "hello again", "replicas": 3}, kubeconfig
    )
    assert upgraded["revision"] == 2
    configmap = emu.get("", "v1", "configmaps", "demo-config", "default")
    assert configmap is not None
    assert configmap["data"] == {"greeting": "hello again"}
    deployment = emu.get("apps", "v1", "deployments", "demo-app", "default")
    assert deployment is not None
    assert deployment["spec"]["replicas"] == 3
    assert deployment["metadata"]["generation"] == 2
    releases = await list_releases("default", kubeconfig)
    assert [(r["name"], r["revision"], r["status"]) for r in releases] == [("demo", 2, "deployed")]

    result = await uninstall_chart("demo", "default", kubeconfig)
    assert result["release"]["status"] == "uninstalled"
    assert emu.get("", "v1", "configmaps", "demo-config", "default") is None
    assert emu.get("apps", "v1", "deployments", "demo-app", "default") is None
    assert emu.list("", "v1", "secrets", "default", label_selector="owner=helm") == []
    assert not emu.internal_errors


async def test_install_into_missing_namespace_fails_like_a_real_cluster(
    emu: KubeEmulator, tmp_path: pathlib.Path
) -> None:
    import helm_python

    kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
    with pytest.raises(helm_python.HelmError, match='namespaces "nowhere" not found'):
        await install_chart(CHART, "demo", "nowhere", None, kubeconfig)
    release = await install_chart(CHART, "demo", "nowhere", None, kubeconfig, create_namespace=True)
    assert release["status"] == "deployed"
    assert emu.get("", "v1", "namespaces", "nowhere") is not None
    assert emu.get("", "v1", "configmaps", "demo-config", "nowhere") is not None
