"""Benchmark: time for the operator to reconcile N ModelDeployments x R regions; prints one JSON object.

The operator runs as its own process through the real command line (`fleetwarden operator`), against
the Kubernetes API emulator served from this process, so its peak RSS is the operator's alone. Two
phases are timed from the first write to a settled fleet (every child present, every status current):

- create: R RegionPools and N ModelDeployments, each placed in all R pools;
- update: every ModelDeployment's minInstances raised by one (every Deployment patched).

Usage: python bench/operator_reconcile.py [--models 50] [--regions 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleetwarden.api.crds import all_crds  # noqa: E402
from fleetwarden.operator.kube import MODEL_DEPLOYMENTS, KubeClient  # noqa: E402
from tests.support.kube_emulator import KubeEmulator  # noqa: E402

NAMESPACE = "bench"


def pool(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "fleetwarden.dev/v1alpha1",
        "kind": "RegionPool",
        "metadata": {"name": f"pool-{index}"},
        "spec": {
            "region": f"region-{index}",
            "gpuType": "A100-80GB",
            "capacity": {"gpus": 100_000},
            "costPerHour": 3.0,
            "nodeSelector": {"fleetwarden.dev/pool": f"pool-{index}"},
        },
    }


def model_deployment(index: int, regions: int, min_instances: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "fleetwarden.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": f"model-{index}", "namespace": NAMESPACE},
        "spec": {
            "model": {"name": f"org/model-{index}", "gpusPerInstance": 1},
            "throughput": {"A100-80GB": 2000},
            "regions": [
                {"pool": f"pool-{r}", "minInstances": min_instances, "maxInstances": 10}
                for r in range(regions)
            ],
        },
    }


class RssSampler:
    """Samples a process's resident set size until stopped; keeps the peak."""

    def __init__(self, pid: int) -> None:
        self._process = psutil.Process(pid)
        self.peak_bytes = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            try:
                self.peak_bytes = max(self.peak_bytes, self._process.memory_info().rss)
            except psutil.Error:
                return
            await asyncio.sleep(0.05)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def settled(emu: KubeEmulator, models: int, regions: int, min_instances: int) -> bool:
    deployments = emu.list("apps", "v1", "deployments", NAMESPACE)
    if len(deployments) != models * regions:
        return False
    if any(d["spec"]["replicas"] != min_instances for d in deployments):
        return False
    for md in emu.list("fleetwarden.dev", "v1alpha1", "modeldeployments", NAMESPACE):
        status = md.get("status") or {}
        if status.get("observedGeneration") != md["metadata"]["generation"]:
            return False
        if status.get("instances") != min_instances * regions:
            return False
    return True


async def wait_settled(
    emu: KubeEmulator, models: int, regions: int, min_instances: int, timeout_s: float
) -> float:
    start = time.perf_counter()
    await emu.wait_for(lambda: settled(emu, models, regions, min_instances), timeout=timeout_s)
    return time.perf_counter() - start


async def quiet(emu: KubeEmulator, period_s: float = 1.0) -> None:
    """Wait until a whole period passes without a write (the operator has nothing left to do)."""
    while True:
        version = emu.resource_version
        await asyncio.sleep(period_s)
        if emu.resource_version == version:
            return


async def run(models: int, regions: int, timeout_s: float) -> dict[str, Any]:
    async with KubeEmulator() as emu:
        for crd in all_crds().values():
            await emu.apply_crd(crd)
        emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = emu.write_kubeconfig(Path(tmp) / "kubeconfig")
            env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_NAME": "bench-operator"}
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "fleetwarden.cli", "operator", "--all-namespaces",
                "--resync-seconds", "3600",
                env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            sampler = RssSampler(process.pid)
            sampler.start()
            try:
                await emu.wait_for(
                    lambda: (
                        {"modeldeployments", "deployments"}
                        <= {w.plural for w in emu.active_watches}
                    ),
                    timeout=60,
                )
                idle_rss = psutil.Process(process.pid).memory_info().rss

                mark = emu.mark()
                for index in range(regions):
                    emu.create(pool(index))
                for index in range(models):
                    emu.create(model_deployment(index, regions))
                create_s = await wait_settled(emu, models, regions, 1, timeout_s)
                await quiet(emu)
                create_requests = len(emu.requests) - mark
                create_writes = len(emu.writes_since(mark))

                os.environ["KUBECONFIG"] = str(kubeconfig)
                kube = await KubeClient.connect()
                mark = emu.mark()
                for index in range(models):
                    spec = model_deployment(index, regions, 2)["spec"]
                    await kube.merge_patch(
                        MODEL_DEPLOYMENTS, f"model-{index}", {"spec": spec}, NAMESPACE
                    )
                await kube.close()
                update_s = await wait_settled(emu, models, regions, 2, timeout_s)
                await quiet(emu)
                update_writes = len(emu.writes_since(mark)) - models  # less the bench's own patches
                peak_rss = sampler.peak_bytes
            finally:
                await sampler.stop()
                process.terminate()
                await process.wait()
    return {
        "benchmark": "operator_reconcile",
        "model_deployments": models,
        "regions": regions,
        "children": models * regions * 3,
        "create_seconds": round(create_s, 3),
        "create_children_per_second": round(models * regions * 3 / create_s, 1),
        "create_api_requests": create_requests,
        "create_api_writes": create_writes,
        "update_seconds": round(update_s, 3),
        "update_api_writes": update_writes,
        "operator_idle_rss_mib": round(idle_rss / 2**20, 1),
        "operator_peak_rss_mib": round(peak_rss / 2**20, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(terse=True),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--regions", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.models, args.regions, args.timeout))))


if __name__ == "__main__":
    main()
