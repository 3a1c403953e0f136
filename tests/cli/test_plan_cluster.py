"""`fleetwarden plan` reading the fleet from a live cluster: the Kubernetes API emulator.

Real: the command (in process, `fleetwarden.cli.main`), the operator's API client over HTTP with
a kubeconfig, the CRD schemas the emulator validates with, the example objects, the round.
Mocked: the cluster (the emulator; no operator runs, so the tests write the status and the
Deployment the operator would have). No Prometheus: every region holds, so each target equals the
replicas read, which is what these tests check.

The command blocks (it runs its own event loop), so it runs in a worker thread while the
emulator serves from the test's loop; capsys captures the thread's output too.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fleetwarden.api.crds import all_crds
from fleetwarden.cli import main
from fleetwarden.forecasting.hourly import PoolUsage
from fleetwarden.operator.fleet_reader import read_fleet
from fleetwarden.operator.kube import MODEL_DEPLOYMENTS, REGION_POOLS, KubeClient
from tests.support.fleet_operator import example_objects
from tests.support.kube_emulator import KubeEmulator
from tests.support.prometheus_server import free_port

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
pytestmark = pytest.mark.timeout(120)
NS = "llm-serving"
LLAMA = f"{NS}/llama-3-70b"
MISTRAL = f"{NS}/mistral-7b"


def deployment(name: str, namespace: str, replicas: int) -> dict[str, Any]:
    """A serving Deployment as far as the reader cares: its name and spec.replicas."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
            },
        },
    }


async def store_with_old_schema(
    emu: KubeEmulator, crd: dict[str, Any], obj: dict[str, Any]
) -> None:
    """Put an object the current schema rejects into the cluster, as a CRD upgrade leaves one:
    create it under a schema that accepts anything, then put the real schema back."""
    loose = copy.deepcopy(crd)
    for version in loose["spec"]["versions"]:
        version["schema"]["openAPIV3Schema"]["properties"]["spec"] = {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }
    await emu.apply_crd(loose)
    emu.create(obj)
    await emu.apply_crd(crd)


@pytest.fixture
async def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[KubeEmulator]:
    """The examples applied through the API, status and one Deployment as the operator leaves
    them, and two objects the operator cannot plan."""
    async with KubeEmulator() as emu:
        crds = all_crds()
        for crd in crds.values():
            await emu.apply_crd(crd)
        monkeypatch.setenv("KUBECONFIG", str(emu.write_kubeconfig(tmp_path / "kubeconfig")))
        emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-b"}})
        kube = await KubeClient.connect()
        try:
            for obj in example_objects():
                if obj["kind"] in {"Namespace", "RegionPool", "ModelDeployment"}:
                    await kube.create(obj)
            # llama: two regions with status, the third only a Deployment; mistral: one of each.
            await kube.patch_status(
                MODEL_DEPLOYMENTS,
                "llama-3-70b",
                {
                    "regions": [
                        {"pool": "us-east-a100", "current": 5},
                        {"pool": "us-west-a100", "current": 3},
                    ]
                },
                NS,
            )
            await kube.patch_status(
                MODEL_DEPLOYMENTS,
                "mistral-7b",
                {"regions": [{"pool": "us-east-a100", "current": 6}]},
                NS,
            )
            await kube.create(deployment("llama-3-70b-eu-west-h100", NS, 4))
            # Valid for the API server, not plannable: its pool does not exist.
            ghost = copy.deepcopy(
                next(o for o in example_objects() if o["metadata"]["name"] == "mistral-7b")
            )
            ghost["metadata"] = {"name": "ghost", "namespace": NS}
            ghost["spec"]["regions"] = [
                {"pool": "ap-south-a100", "minInstances": 1, "maxInstances": 2}
            ]
            await kube.create(ghost)
            # A model of another namespace, holding 8 GPUs of us-east-a100 per the pool's status.
            other = copy.deepcopy(ghost)
            other["metadata"] = {"name": "qwen", "namespace": "team-b"}
            other["spec"]["regions"] = [
                {"pool": "us-east-a100", "minInstances": 1, "maxInstances": 8}
            ]
            await kube.create(other)
            await kube.patch_status(
                REGION_POOLS,
                "us-east-a100",
                {
                    "allocations": [
                        {"modelDeployment": "team-b/qwen", "instances": 8, "gpus": 8},
                        {"modelDeployment": MISTRAL, "instances": 6, "gpus": 6},
                    ]
                },
            )
        finally:
            await kube.close()
        await store_with_old_schema(
            emu,
            crds["regionpools.yaml"],
            {
                "apiVersion": "fleetwarden.dev/v1alpha1",
                "kind": "RegionPool",
                "metadata": {"name": "broken-pool"},
                "spec": {"region": "us-east", "gpuType": "A100-80GB"},
            },
        )
        yield emu


async def plan(*args: str) -> int:
    return await asyncio.to_thread(main, ["plan", *args])


async def test_plan_reads_the_cluster_and_writes_nothing(
    cluster: KubeEmulator, capsys: pytest.CaptureFixture[str]
) -> None:
    mark = cluster.mark()
    assert await plan("--json") == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    rows = {(r["model_deployment"], r["pool"]): r for r in data["endpoints"]}
    assert {k: (r["current"], r["current_source"]) for k, r in rows.items()} == {
        (LLAMA, "us-east-a100"): (5, "status"),
        (LLAMA, "us-west-a100"): (3, "status"),
        (LLAMA, "eu-west-h100"): (4, "deployment"),
        (MISTRAL, "us-east-a100"): (6, "status"),
        (MISTRAL, "eu-west-h100"): (1, "minInstances"),
        ("team-b/qwen", "us-east-a100"): (1, "minInstances"),
    }
    # No history: every region holds what runs now.
    assert data["history"] == "none"
    assert all(r["held"] and r["target"] == r["current"] and r["delta"] == 0 for r in rows.values())
    warnings = err.strip().splitlines()
    assert len(warnings) == 2
    assert all(w.startswith("fleetwarden plan: warning: ") for w in warnings)
    assert "RegionPool broken-pool skipped" in warnings[0]
    assert f"ModelDeployment {NS}/ghost skipped" in warnings[1]
    assert "pool ap-south-a100 is missing or invalid" in warnings[1]

    assert cluster.writes_since(mark) == []
    paths = {r.path for r in cluster.requests[mark:]}
    assert "/apis/fleetwarden.dev/v1alpha1/regionpools" in paths
    assert "/apis/fleetwarden.dev/v1alpha1/modeldeployments" in paths
    assert f"/apis/apps/v1/namespaces/{NS}/deployments/llama-3-70b-eu-west-h100" in paths

    assert await plan() == 0
    table = capsys.readouterr().out.splitlines()
    assert "no --prometheus: no history, every region holds its current replicas" in table
    body = [line for line in table[1:] if line.startswith(("llm-serving/", "team-b/"))]
    assert len(body) == 6
    assert all("no-data (held)" in line for line in body)
    east = next(line for line in body if line.startswith(LLAMA) and "us-east-a100" in line)
    assert east.split()[3:5] == ["5", "status"]
    assert cluster.writes_since(mark) == []


async def test_namespace_reads_only_that_namespace(
    cluster: KubeEmulator, capsys: pytest.CaptureFixture[str]
) -> None:
    mark = cluster.mark()
    assert await plan("--json", "--namespace", "team-b") == 0
    rows = json.loads(capsys.readouterr().out)["endpoints"]
    assert [(r["model_deployment"], r["pool"], r["current"]) for r in rows] == [
        ("team-b/qwen", "us-east-a100", 1)
    ]
    paths = {r.path for r in cluster.requests[mark:]}
    assert "/apis/fleetwarden.dev/v1alpha1/namespaces/team-b/modeldeployments" in paths
    assert "/apis/fleetwarden.dev/v1alpha1/modeldeployments" not in paths
    assert cluster.writes_since(mark) == []


async def test_other_namespaces_keep_their_share_of_shared_pools(cluster: KubeEmulator) -> None:
    """What the pools' status says other namespaces hold is reserved, so the plan of one
    namespace cannot give it away."""
    kube = await KubeClient.connect()
    try:
        fleet = await read_fleet(kube, NS)
    finally:
        await kube.close()
    reserved = fleet.snapshot.reserved
    # team-b/qwen's 8 GPUs from the pool's status, plus ghost's nothing (its pool is unknown).
    assert reserved == {"us-east-a100": PoolUsage(instances=8, gpus=8)}
    assert set(fleet.snapshot.specs.model_deployments) == {LLAMA, MISTRAL}


async def test_current_file_overrides_the_cluster(
    cluster: KubeEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    current = tmp_path / "current.yaml"
    current.write_text(f"{LLAMA}: {{us-east-a100: 9}}\n")
    assert await plan("--json", "--current", str(current)) == 0
    rows = {
        (r["model_deployment"], r["pool"]): r
        for r in json.loads(capsys.readouterr().out)["endpoints"]
    }
    assert (
        rows[(LLAMA, "us-east-a100")]["current"],
        rows[(LLAMA, "us-east-a100")]["current_source"],
    ) == (9, "--current")
    assert rows[(LLAMA, "us-west-a100")]["current_source"] == "status"


def test_unreachable_cluster_exits_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing listens on the port: the command says so in one line, no traceback."""
    config = tmp_path / "kubeconfig"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "gone", "cluster": {"server": f"http://127.0.0.1:{free_port()}"}}
                ],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}],
                "current-context": "gone",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    assert main(["plan"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("fleetwarden plan: cannot read the fleet: cluster unreachable")


def test_no_cluster_configuration_exits_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No kubeconfig and not in a pod: the message says what is missing."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    assert main(["plan"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "no cluster configuration" in lines[0]
