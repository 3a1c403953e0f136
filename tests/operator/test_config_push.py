"""Config push: the operator puts each ModelDeployment's fairness config into its live sidecars
and counts the pods that acknowledged it.

Real sidecars (the production aiohttp app) listen on 127.0.0.2, 127.0.0.3, ... with one port,
like pods with their own IPs; their engine is the stub (no GPU here). In the end-to-end test the
API server is the emulator and no kubelet runs, so the test creates the Pod objects (with podIP
and Ready) and the Deployment status change a kubelet and controller-manager would cause.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from fleetwarden.api.enums import PolicyName
from fleetwarden.operator import naming
from fleetwarden.operator.config_push import ConfigPusher, DesiredConfig
from fleetwarden.operator.kube import DEPLOYMENTS, PODS
from tests.support.eventually import eventually as _eventually
from tests.support.fleet_operator import RunningOperator, example_objects, running_operator
from tests.support.kube_emulator import KubeEmulator
from tests.support.sidecar_stack import (
    ADMIN_TOKEN,
    SidecarHandle,
    fairness_config,
    free_port,
    running_sidecar,
    running_stub,
)

pytestmark = pytest.mark.timeout(120)
NS = "llm-serving"


def pod(
    name: str, ip: str, port: int, *, ready: bool, md: str = "chat", ns: str = NS
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {naming.MODEL_DEPLOYMENT_LABEL: md},
        },
        "spec": {
            "containers": [{"name": "sidecar", "ports": [{"name": "http", "containerPort": port}]}]
        },
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


async def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    await _eventually(check, timeout_s)


@contextlib.asynccontextmanager
async def sidecars(
    hosts: list[str], port: int, engine: str, token: str = ADMIN_TOKEN
) -> AsyncIterator[list[SidecarHandle]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                running_sidecar(engine, host=h, port=port, admin_token=token)
            )
            for h in hosts
        ]


async def test_pushes_to_ready_pods_on_change_and_on_readiness() -> None:
    port = free_port()
    changes: list[str] = []
    pusher = ConfigPusher(on_change=changes.append)
    v1 = fairness_config(policy=PolicyName.VTC)
    v2 = fairness_config(policy=PolicyName.DRR)
    async with (
        running_stub(time_scale=0.1) as stub,
        sidecars(["127.0.0.2", "127.0.0.3"], port, stub.url) as (a, b),
    ):
        pusher.set_desired(f"{NS}/chat", DesiredConfig(v1.version, v1.to_document(), ADMIN_TOKEN))
        pusher.observe_pod(pod("p1", "127.0.0.2", port, ready=True))
        pusher.observe_pod(pod("p2", "127.0.0.3", port, ready=False))
        await eventually(lambda: pusher.counts(f"{NS}/chat") == (1, 1))
        assert a.state.dispatcher.scheduler.version == v1.version
        assert b.state.dispatcher.scheduler.version != v1.version  # not ready: not pushed

        pusher.observe_pod(pod("p2", "127.0.0.3", port, ready=True))  # readiness triggers a push
        await eventually(lambda: pusher.counts(f"{NS}/chat") == (2, 2))
        assert b.state.dispatcher.scheduler.version == v1.version

        pusher.set_desired(f"{NS}/chat", DesiredConfig(v2.version, v2.to_document(), ADMIN_TOKEN))
        assert pusher.counts(f"{NS}/chat") == (0, 2)  # nobody runs the new version yet
        await eventually(lambda: pusher.counts(f"{NS}/chat") == (2, 2))
        assert {a.state.dispatcher.config.policy, b.state.dispatcher.config.policy} == {
            PolicyName.DRR
        }

        pusher.sync_pods(f"{NS}/chat", [pod("p1", "127.0.0.2", port, ready=True)])  # p2 went away
        assert pusher.counts(f"{NS}/chat") == (1, 1)
        assert f"{NS}/chat" in changes
    await pusher.close()


async def test_unreachable_or_refusing_sidecars_are_retried_until_they_accept() -> None:
    port = free_port()
    pusher = ConfigPusher()
    config = fairness_config(policy=PolicyName.VTC)
    pusher.set_desired(
        f"{NS}/chat", DesiredConfig(config.version, config.to_document(), ADMIN_TOKEN)
    )
    pusher.observe_pod(pod("p1", "127.0.0.4", port, ready=True))
    await asyncio.sleep(0.3)
    assert pusher.counts(f"{NS}/chat") == (0, 1)  # nothing listens there yet
    async with running_stub(time_scale=0.1) as stub:
        async with sidecars(["127.0.0.4"], port, stub.url, token="another-token-entirely") as _:
            await asyncio.sleep(1.0)
            assert pusher.counts(f"{NS}/chat") == (0, 1)  # a wrong token is refused: not counted
        async with sidecars(["127.0.0.4"], port, stub.url) as (sidecar,):
            await eventually(lambda: pusher.counts(f"{NS}/chat") == (1, 1), timeout_s=40)
            assert sidecar.state.dispatcher.scheduler.version == config.version
    await pusher.close()


@pytest.fixture
async def op() -> AsyncIterator[RunningOperator]:
    async with KubeEmulator() as emulator, running_operator(emulator) as running:
        yield running


async def test_operator_pushes_tenant_policy_changes_and_counts_acknowledgements(
    op: RunningOperator,
) -> None:
    port = free_port()
    objects = [copy.deepcopy(o) for o in example_objects() if o["kind"] != "Namespace"]
    md = next(
        o
        for o in objects
        if o["kind"] == "ModelDeployment" and o["metadata"]["name"] == "mistral-7b"
    )
    md["spec"].setdefault("sidecar", {})["port"] = port
    await op.apply(objects)
    await op.settle()
    policy_name = op.get("ModelDeployment", "mistral-7b", NS)["status"]["tenantPolicy"]  # type: ignore[index]

    secret = op.emulator.get("", "v1", "secrets", naming.secret_name("mistral-7b"), NS)
    assert secret is not None
    token = base64.b64decode(secret["data"]["admin-token"]).decode()
    deployments = op.list("Deployment", NS, naming.children_selector("mistral-7b"))
    assert deployments
    async with (
        running_stub(time_scale=0.1) as stub,
        sidecars(["127.0.0.5", "127.0.0.6"], port, stub.url, token) as live,
    ):
        # What the kubelet and the controller-manager would do: pods run and become ready.
        for index, deployment in enumerate(deployments[:2]):
            template = deployment["spec"]["template"]
            body = pod(
                f"mistral-{index}", f"127.0.0.{5 + index}", port, ready=True, md="mistral-7b"
            )
            body["metadata"]["labels"] = template["metadata"]["labels"]
            body["spec"] = template["spec"]
            status = body.pop("status")
            op.emulator.create(body)  # the status subresource is written separately, as kubelets do
            await op.kube.patch_status(PODS, body["metadata"]["name"], status, NS)
            await op.kube.patch_status(
                DEPLOYMENTS, deployment["metadata"]["name"], {"readyReplicas": 1}, NS
            )

        def acknowledged() -> tuple[int, int]:
            status = op.get("TenantPolicy", policy_name, NS)["status"]  # type: ignore[index]
            return status.get("podsAcknowledged"), status.get("podsTotal")

        await eventually(lambda: acknowledged() == (2, 2))
        config_map = op.list("ConfigMap", NS, naming.children_selector("mistral-7b"))[0]
        version = config_map["metadata"]["annotations"][naming.CONFIG_VERSION_ANNOTATION]
        assert all(s.state.dispatcher.scheduler.version == version for s in live)

        # A TenantPolicy change reaches the live sidecars without a rollout.
        policy = op.get("TenantPolicy", policy_name, NS)
        assert policy is not None
        await op.patch(policy, {"spec": {"defaults": {"rpm": 1234}}})
        await eventually(lambda: live[0].state.dispatcher.config.defaults.rpm == 1234)
        await eventually(lambda: all(s.state.dispatcher.config.defaults.rpm == 1234 for s in live))
        await eventually(lambda: acknowledged() == (2, 2))
