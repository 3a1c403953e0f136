"""Run the real fleetwarden operator against the API emulator: for e2e tests, the demo and benches.

Mocked: only the cluster (the emulator stands in for the API server, and no controller-manager runs,
so Deployments do not get pods unless a test writes their status). Everything of fleetwarden is real:
its registry of Kopf handlers, its startup, its API client (through a kubeconfig), its Events.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import tempfile
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import kopf
import yaml

from fleetwarden.api.crds import all_crds
from fleetwarden.operator.kube import KubeClient, kind_of
from fleetwarden.operator.main import OperatorSettings, build_registry
from fleetwarden.operator.runtime import Runtime
from tests.support.kopf_runner import run_kopf
from tests.support.kube_emulator import KubeEmulator

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"

PLURALS = {
    "RegionPool": ("fleetwarden.dev", "v1alpha1", "regionpools"),
    "ModelDeployment": ("fleetwarden.dev", "v1alpha1", "modeldeployments"),
    "TenantPolicy": ("fleetwarden.dev", "v1alpha1", "tenantpolicies"),
    "Deployment": ("apps", "v1", "deployments"),
    "Service": ("", "v1", "services"),
    "ConfigMap": ("", "v1", "configmaps"),
    "Event": ("", "v1", "events"),
    "Namespace": ("", "v1", "namespaces"),
    "Pod": ("", "v1", "pods"),
    "Secret": ("", "v1", "secrets"),
}


def example_objects(directory: pathlib.Path = EXAMPLES) -> list[dict[str, Any]]:
    """Every object of `directory/*.yaml` in the order `kubectl apply -f` would apply them."""
    objects: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.yaml")):
        objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return objects


@dataclass
class RunningOperator:
    """The emulator with the operator running on it, and ways to wait for it."""

    emulator: KubeEmulator
    runtime: Runtime
    kube: KubeClient
    """A client of the test's own, talking HTTP to the emulator like kubectl would."""

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        group, version, plural = PLURALS[kind]
        return self.emulator.get(group, version, plural, name, namespace)

    def list(
        self, kind: str, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        group, version, plural = PLURALS[kind]
        return self.emulator.list(group, version, plural, namespace, label_selector)

    async def apply(self, objects: Iterable[dict[str, Any]]) -> None:
        """Create each object, or merge-patch its labels and spec if it exists (`kubectl apply`)."""
        for obj in objects:
            kind = kind_of(obj)
            metadata = obj["metadata"]
            namespace = metadata.get("namespace")
            if await self.kube.get(kind, metadata["name"], namespace) is None:
                await self.kube.create(obj)
            else:
                patch = {"metadata": {"labels": metadata.get("labels")}, "spec": obj.get("spec")}
                await self.kube.merge_patch(kind, metadata["name"], patch, namespace)

    async def patch(self, obj: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
        metadata = obj["metadata"]
        return await self.kube.merge_patch(
            kind_of(obj), metadata["name"], patch, metadata.get("namespace")
        )

    async def settle(self, quiet_s: float = 0.25, timeout_s: float = 30.0) -> None:
        """Wait until the operator has nothing left to do: no reconcile running, no new writes.

        Events travel through watch streams, so "idle now" can be followed by a late event; the
        fleet is settled once a quiet period passes with no change in the cluster.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            await self.runtime.idle()
            version = self.emulator.resource_version
            await asyncio.sleep(quiet_s)
            await self.runtime.idle()
            if self.emulator.resource_version == version:
                return
        raise TimeoutError("the operator did not settle")

    def events_for(self, name: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.emulator.list("", "v1", "events", namespace)
            if e.get("involvedObject", {}).get("name") == name
        ]


@contextlib.asynccontextmanager
async def running_operator(
    emulator: KubeEmulator,
    settings: OperatorSettings | None = None,
    namespaces: Iterable[str] = ("llm-serving",),
) -> AsyncIterator[RunningOperator]:
    """Install the CRDs, create `namespaces`, and run the operator until the block exits."""
    settings = settings or OperatorSettings(peering_name=None, resync_seconds=3600)
    for crd in all_crds().values():
        await emulator.apply_crd(crd)
    for namespace in namespaces:
        if emulator.get("", "v1", "namespaces", namespace) is None:
            emulator.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = emulator.write_kubeconfig(pathlib.Path(tmp) / "kubeconfig")
        previous = os.environ.get("KUBECONFIG")
        os.environ["KUBECONFIG"] = str(kubeconfig)
        try:
            memo = kopf.Memo()
            registry = build_registry(settings)
            scope: dict[str, Any] = (
                {"namespaces": list(settings.namespaces)}
                if settings.namespaces
                else {"clusterwide": True}
            )
            async with run_kopf(emulator, registry=registry, memo=memo, **scope):
                runtime = memo.runtime
                assert isinstance(runtime, Runtime)
                kube = await KubeClient.connect()
                try:
                    yield RunningOperator(emulator=emulator, runtime=runtime, kube=kube)
                finally:
                    await kube.close()
        finally:
            if previous is None:
                os.environ.pop("KUBECONFIG", None)
            else:
                os.environ["KUBECONFIG"] = previous
