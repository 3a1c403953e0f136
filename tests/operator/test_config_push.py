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
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from fleetwarden.api.enums import PolicyName
from fleetwarden.operator import config_push, naming
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
    serve,
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


def answering_with(versions: list[str]) -> tuple[web.Application, list[str]]:
    """A sidecar stand-in that takes every PUT and says it runs `versions[-1]` (one that hashes
    configs differently, or that another writer keeps setting); the list collects the PUT bodies."""
    puts: list[str] = []

    async def put(request: web.Request) -> web.Response:
        puts.append(await request.text())
        return web.json_response({"version": versions[-1], "changed": True})

    app = web.Application()
    app.router.add_put("/admin/config", put)
    return app, puts


async def test_a_pod_answering_another_version_is_retried_with_backoff_and_reported_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A 200 with another version used to be re-PUT at once, in a loop (thousands of PUTs a
    second). With a first backoff far longer than the test, exactly one PUT may happen; a new
    desired config ends the backoff at once."""
    monkeypatch.setattr(config_push, "FIRST_BACKOFF_S", 600.0)
    port = free_port()
    answers = ["their-version"]
    app, puts = answering_with(answers)
    pusher = ConfigPusher()
    async with serve(app, "127.0.0.7", port):
        with caplog.at_level(logging.WARNING, logger=config_push.__name__):
            pusher.set_desired(f"{NS}/chat", DesiredConfig("ours", "{}", ADMIN_TOKEN))
            pusher.observe_pod(pod("p1", "127.0.0.7", port, ready=True))
            await eventually(lambda: len(puts) >= 1)
            await asyncio.sleep(0.5)  # a hot loop would PUT thousands of times meanwhile
            assert len(puts) == 1
            assert pusher.counts(f"{NS}/chat") == (0, 1)
            assert pusher.disagreeing(f"{NS}/chat") == {f"{NS}/p1": "their-version"}
            warnings = [r for r in caplog.records if "their-version" in r.getMessage()]
            assert len(warnings) == 1

            answers.append("ours-2")
            pusher.set_desired(f"{NS}/chat", DesiredConfig("ours-2", "{}", ADMIN_TOKEN))
            await eventually(lambda: pusher.counts(f"{NS}/chat") == (1, 1))
            assert len(puts) == 2
            assert pusher.disagreeing(f"{NS}/chat") == {}
    await pusher.close()


async def test_a_pod_ready_again_at_the_same_ip_is_pushed_again() -> None:
    """A restarted sidecar container loads the mounted ConfigMap, which may be stale, and comes
    back at the pod's IP: not ready, then ready. It must get the desired config again, and not
    count as acknowledged until it has."""
    port = free_port()
    changes: list[str] = []
    pusher = ConfigPusher(on_change=changes.append)
    desired = fairness_config(policy=PolicyName.VTC)
    stale = fairness_config(policy=PolicyName.DRR)
    pusher.set_desired(
        f"{NS}/chat", DesiredConfig(desired.version, desired.to_document(), ADMIN_TOKEN)
    )
    async with running_stub(time_scale=0.1) as stub:
        async with running_sidecar(stub.url, stale, host="127.0.0.8", port=port) as first:
            pusher.observe_pod(pod("p1", "127.0.0.8", port, ready=True))
            await eventually(lambda: pusher.counts(f"{NS}/chat") == (1, 1))
            assert first.state.dispatcher.scheduler.version == desired.version
        pusher.observe_pod(pod("p1", "127.0.0.8", port, ready=False))  # the container restarts
        assert pusher.counts(f"{NS}/chat") == (0, 0)
        async with running_sidecar(stub.url, stale, host="127.0.0.8", port=port) as second:
            assert second.state.dispatcher.scheduler.version == stale.version
            changes.clear()
            pusher.observe_pod(pod("p1", "127.0.0.8", port, ready=True))
            assert pusher.counts(f"{NS}/chat") == (0, 1)  # the new process acknowledged nothing
            await eventually(lambda: second.state.dispatcher.scheduler.version == desired.version)
            await eventually(lambda: pusher.counts(f"{NS}/chat") == (1, 1))
            assert f"{NS}/chat" in changes
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
