"""Two operator replicas: only the leader acts; the other takes over when the leader stops.

Both replicas are real `fleetwarden operator` processes with peering on, as the chart runs them
(priorities derived from their pod names). Mocked: the cluster only (the API emulator).
"""

from __future__ import annotations

import asyncio
import copy
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetwarden.api.crds import all_crds
from fleetwarden.operator.main import peering_priority
from tests.support.fleet_operator import example_objects
from tests.support.kube_emulator import KubeEmulator

pytestmark = pytest.mark.timeout(180)
LEADER, STANDBY = "fleetwarden-a", "fleetwarden-b"
NS = "llm-serving"


async def _start(name: str, kubeconfig: Path, log: Path) -> asyncio.subprocess.Process:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_NAME": name, "POD_ID": name}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fleetwarden.cli", "operator", "--all-namespaces",
        "--peering", "fleetwarden", "--resync-seconds", "3600",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip


def _peers(emu: KubeEmulator) -> set[str]:
    peering = emu.get("kopf.dev", "v1", "clusterkopfpeerings", "fleetwarden") or {}
    return set(peering.get("status") or {})


def _model(name: str) -> dict[str, Any]:
    md = copy.deepcopy(next(o for o in example_objects() if o["kind"] == "ModelDeployment"))
    md["metadata"] = {"name": name, "namespace": NS}
    md["spec"]["regions"] = [{"pool": "us-east-a100", "minInstances": 1, "maxInstances": 2}]
    return md


async def test_only_the_leader_acts_and_the_standby_takes_over(tmp_path: Path) -> None:
    assert peering_priority(LEADER) > peering_priority(STANDBY)
    async with KubeEmulator() as emu:
        for crd in all_crds().values():
            await emu.apply_crd(crd)
        for obj in example_objects():
            if obj["kind"] in ("Namespace", "RegionPool"):
                emu.create(obj)
        kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
        leader_log, standby_log = tmp_path / "leader.log", tmp_path / "standby.log"
        leader = await _start(LEADER, kubeconfig, leader_log)
        standby: asyncio.subprocess.Process | None = None
        try:
            await emu.wait_for(lambda: "Resuming operations" in leader_log.read_text(), timeout=60)
            # The standby joins a neighbourhood with a higher-priority leader: it starts paused
            # and must stay paused, heartbeating only.
            standby = await _start(STANDBY, kubeconfig, standby_log)
            await emu.wait_for(lambda: STANDBY in _peers(emu), timeout=60)
            emu.create(_model("first"))
            await emu.wait_for(
                lambda: emu.get("apps", "v1", "deployments", "first-us-east-a100", NS), timeout=30
            )
            assert "Resuming operations" not in standby_log.read_text()
            assert "modeldeployment-event" not in standby_log.read_text()

            leader.terminate()
            await leader.wait()
            emu.create(_model("second"))
            await emu.wait_for(
                lambda: emu.get("apps", "v1", "deployments", "second-us-east-a100", NS), timeout=60
            )
            assert "Resuming operations" in standby_log.read_text()
            assert "modeldeployment-event" in standby_log.read_text()
        finally:
            for process in (leader, standby):
                if process is not None and process.returncode is None:
                    process.terminate()
                    await process.wait()
