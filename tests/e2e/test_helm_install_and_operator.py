"""Install the chart with real Helm into the API emulator, then run the operator it describes.

The operator runs as its own process, started with exactly the command and arguments of the
Deployment Helm installed (only the liveness port is moved to a free one), so the chart, the CLI,
authentication from a kubeconfig and peering are checked together.

Mocked: the cluster (no kubelet starts the pod, so the test starts the process the pod would run;
RBAC is not enforced by the emulator, which is why the chart tests pin every rule separately).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fleetwarden.operator.kube import KubeClient
from tests.support.fleet_operator import example_objects
from tests.support.helm_install import install_chart, uninstall_chart
from tests.support.helm_render import CHART_DIR
from tests.support.kube_emulator import KubeEmulator

pytestmark = pytest.mark.timeout(240)
RELEASE, NAMESPACE = "fleetwarden", "fleetwarden-system"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _operator_command(deployment: dict[str, Any], port: int) -> list[str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["fleetwarden", "operator"]
    args = [a.replace("0.0.0.0:8080", f"127.0.0.1:{port}") for a in container["args"]]
    return [sys.executable, "-m", "fleetwarden.cli", "operator", *args]


async def test_chart_installs_and_its_operator_reconciles_the_examples(tmp_path: Path) -> None:
    async with KubeEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        await install_chart(CHART_DIR, RELEASE, NAMESPACE, {}, kubeconfig, create_namespace=True)

        crds = {
            c["metadata"]["name"]
            for c in emulator.list("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        }
        assert {"regionpools.fleetwarden.dev", "modeldeployments.fleetwarden.dev"} <= crds
        deployment = emulator.get("apps", "v1", "deployments", RELEASE, NAMESPACE)
        assert deployment is not None
        port = _free_port()
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_NAME": "fleetwarden-abc12"}
        process = await asyncio.create_subprocess_exec(
            *_operator_command(deployment, port),
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            os.environ["KUBECONFIG"] = str(kubeconfig)
            kube = await KubeClient.connect()
            try:
                for obj in example_objects():
                    await kube.create(obj)
            finally:
                await kube.close()
            await emulator.wait_for(
                lambda: len(emulator.list("apps", "v1", "deployments", "llm-serving")) == 5,
                timeout=60,
            )
            # Leader election: the operator created its peering object and heartbeats into it.
            peering = await emulator.wait_for(
                lambda: (
                    emulator.get("kopf.dev", "v1", "clusterkopfpeerings", "fleetwarden") or {}
                ).get("status"),
                timeout=30,
            )
            assert peering
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{port}/healthz") as response,
            ):
                assert response.status == 200
        finally:
            process.terminate()
            _, stderr = await process.communicate()
            os.environ.pop("KUBECONFIG", None)
        assert process.returncode is not None
        log = stderr.decode(errors="replace")
        if "Traceback" in log:
            pytest.fail("the operator logged a traceback:\n" + log[log.index("Traceback") - 2000 :])

        await uninstall_chart(RELEASE, NAMESPACE, kubeconfig)
        assert emulator.get("apps", "v1", "deployments", RELEASE, NAMESPACE) is None
        # crds.keep: uninstalling the operator must not delete every user's fleet with the CRDs.
        assert emulator.get(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "modeldeployments.fleetwarden.dev",
        )
