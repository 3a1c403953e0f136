"""The operator end to end: real Kopf, real fleetwarden handlers, HTTP to an API server emulator.

Mocked: the cluster only (kmock's emulator, extended in tests/support, stands in for the API
server; no controller-manager runs, so tests write Deployment status where readiness matters).
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleetwarden.operator import naming
from fleetwarden.operator.kube import DEPLOYMENTS, MODEL_DEPLOYMENTS, SERVICES
from fleetwarden.operator.main import OperatorSettings, ensure_peering
from tests.support.fleet_operator import RunningOperator, example_objects, running_operator
from tests.support.kube_emulator import KubeEmulator

NS = "llm-serving"
pytestmark = pytest.mark.timeout(120)


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    assert obj is not None
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == type_:
            return dict(cond)
    raise AssertionError(f"no {type_} condition in {obj.get('status')}")


def example(kind: str, name: str) -> dict[str, Any]:
    return copy.deepcopy(
        next(o for o in example_objects() if o["kind"] == kind and o["metadata"]["name"] == name)
    )


@pytest.fixture
async def op() -> AsyncIterator[RunningOperator]:
    async with KubeEmulator() as emulator, running_operator(emulator) as running:
        yield running


@pytest.fixture
async def fleet(op: RunningOperator) -> RunningOperator:
    """The operator with examples/ applied and settled."""
    await op.apply(o for o in example_objects() if o["kind"] != "Namespace")
    await op.settle()
    return op


async def test_examples_become_deployments_services_and_config_maps(fleet: RunningOperator) -> None:
    deployments = {d["metadata"]["name"]: d for d in fleet.list("Deployment", NS)}
    assert set(deployments) == {
        "llama-3-70b-us-east-a100",
        "llama-3-70b-us-west-a100",
        "llama-3-70b-eu-west-h100",
        "mistral-7b-us-east-a100",
        "mistral-7b-eu-west-h100",
    }
    md = fleet.get("ModelDeployment", "llama-3-70b", NS)
    assert md is not None
    east = deployments["llama-3-70b-us-east-a100"]
    assert east["spec"]["replicas"] == 2  # minInstances
    pod = east["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == example("RegionPool", "us-east-a100")["spec"]["nodeSelector"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    (owner,) = east["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "ModelDeployment",
        md["metadata"]["uid"],
        True,
    )
    for name in deployments:
        service = fleet.get("Service", name, NS)
        config_map = fleet.get("ConfigMap", f"{name}-fairness", NS)
        assert service is not None
        assert config_map is not None
        assert (
            service["metadata"]["ownerReferences"][0]["uid"]
            == deployments[name]["metadata"]["ownerReferences"][0]["uid"]
        )


async def test_status_conditions_and_events_are_written(fleet: RunningOperator) -> None:
    md = fleet.get("ModelDeployment", "llama-3-70b", NS)
    assert md is not None
    status = md["status"]
    assert status["observedGeneration"] == md["metadata"]["generation"]
    assert (status["regionCount"], status["instances"], status["readyInstances"]) == (3, 4, 0)
    assert status["tenantPolicy"] == "enterprise"
    ready = condition(md, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PodsNotReady")
    assert condition(md, "Degraded")["status"] == "False"
    assert condition(md, "Progressing")["status"] == "True"
    reasons = [e["reason"] for e in fleet.events_for("llama-3-70b", NS)]
    assert (
        reasons.count("Created") == 10
    )  # the sidecar Secret + 3 regions x (ConfigMap, Deployment, Service)

    pool = fleet.get("RegionPool", "us-east-a100")
    assert pool is not None
    assert pool["status"]["allocations"] == [
        {"modelDeployment": f"{NS}/llama-3-70b", "instances": 2, "gpus": 8},
        {"modelDeployment": f"{NS}/mistral-7b", "instances": 2, "gpus": 2},
    ]
    assert (pool["status"]["allocatedGpus"], pool["status"]["freeGpus"]) == (10, 54)
    assert condition(pool, "Ready")["status"] == "True"

    policy = fleet.get("TenantPolicy", "agents", NS)
    assert policy is not None
    assert policy["status"]["modelDeployments"] == ["mistral-7b"]
    assert len(policy["status"]["configVersion"]) == 16


async def test_rendered_config_follows_the_selecting_tenant_policy(fleet: RunningOperator) -> None:
    config_map = fleet.get("ConfigMap", "mistral-7b-us-east-a100-fairness", NS)
    assert config_map is not None
    assert '"policy": "wsc"' in config_map["data"]["fairness.json"]
    md = fleet.get("ModelDeployment", "mistral-7b", NS)
    assert md is not None
    version = md["status"]["configVersion"]
    assert config_map["metadata"]["annotations"][naming.CONFIG_VERSION_ANNOTATION] == version

    agents = example("TenantPolicy", "agents")
    await fleet.patch(agents, {"spec": {"policy": "drr"}})
    await fleet.settle()
    config_map = fleet.get("ConfigMap", "mistral-7b-us-east-a100-fairness", NS)
    assert config_map is not None
    assert '"policy": "drr"' in config_map["data"]["fairness.json"]
    md = fleet.get("ModelDeployment", "mistral-7b", NS)
    assert md is not None
    assert md["status"]["configVersion"] != version
    # The pod template did not change: no GPU pod restarts for a policy change.
    deployment = fleet.get("Deployment", "mistral-7b-us-east-a100", NS)
    assert deployment is not None
    assert deployment["metadata"]["generation"] == 1


async def test_reconciling_an_unchanged_fleet_writes_nothing(fleet: RunningOperator) -> None:
    mark = fleet.emulator.mark()
    for md in fleet.list("ModelDeployment"):
        fleet.runtime.model_deployments.request(f"{NS}/{md['metadata']['name']}")
    for pool in fleet.list("RegionPool"):
        fleet.runtime.pools.request(pool["metadata"]["name"])
    await fleet.settle()
    assert fleet.emulator.writes_since(mark) == []


async def test_the_users_objects_are_never_written_only_their_status(
    fleet: RunningOperator,
) -> None:
    """GitOps owns spec, metadata and finalizers; the operator may only write `/status`."""
    await fleet.patch(
        example("ModelDeployment", "mistral-7b"), {"spec": {"niw": {"deadlineSeconds": 3600}}}
    )
    await fleet.settle()
    own_kinds = ("/regionpools", "/modeldeployments", "/tenantpolicies")
    test_client_patch = (
        "PATCH",
        f"/apis/fleetwarden.dev/v1alpha1/namespaces/{NS}/modeldeployments/mistral-7b",
    )
    operator_writes = [
        (method, path)
        for method, path in fleet.emulator.writes_since(0)
        if any(kind in path for kind in own_kinds)
        and method != "POST"
        and (method, path) != test_client_patch
    ]
    assert operator_writes
    assert all(path.endswith("/status") and method == "PATCH" for method, path in operator_writes)
    for md in fleet.list("ModelDeployment", NS):
        assert "finalizers" not in md["metadata"]
        assert not any(
            k.startswith(("kopf.", "fleetwarden.dev/"))
            for k in md["metadata"].get("annotations", {})
        )


async def test_periodic_resync_rereads_everything_and_writes_nothing() -> None:
    settings = OperatorSettings(peering_name=None, resync_seconds=0.3)
    async with KubeEmulator() as emulator, running_operator(emulator, settings) as op:
        await op.apply(o for o in example_objects() if o["kind"] != "Namespace")
        await op.settle(quiet_s=0.5)
        mark = emulator.mark()
        await emulator.wait_for(
            lambda: sum("/modeldeployments/" in r.path for r in emulator.requests[mark:]) >= 4,
            timeout=10,
        )
        await op.settle(quiet_s=0.5)
        assert emulator.writes_since(mark) == []


async def test_namespaced_operator_still_sees_cluster_scoped_pools() -> None:
    """The chart's watchNamespaces mode: ModelDeployments in watched namespaces only."""
    settings = OperatorSettings(peering_name=None, namespaces=(NS,), resync_seconds=3600)
    async with (
        KubeEmulator() as emulator,
        running_operator(emulator, settings, namespaces=(NS, "elsewhere")) as op,
    ):
        await op.apply(o for o in example_objects() if o["kind"] != "Namespace")
        outside = example("ModelDeployment", "mistral-7b")
        outside["metadata"]["namespace"] = "elsewhere"
        await op.apply([outside])
        await op.settle()
        assert len(op.list("Deployment", NS)) == 5
        assert op.list("Deployment", "elsewhere") == []
        assert condition(op.get("RegionPool", "us-east-a100"), "Ready")["status"] == "True"


async def test_spec_update_moves_children_and_removed_regions_are_cleaned_up(
    fleet: RunningOperator,
) -> None:
    llama = example("ModelDeployment", "llama-3-70b")
    regions = [
        {"pool": "us-east-a100", "minInstances": 3, "maxInstances": 12},
        {"pool": "eu-west-h100", "minInstances": 1, "maxInstances": 8},
    ]
    await fleet.patch(
        llama,
        {"spec": {"regions": regions, "model": {"engine": {"image": "vllm/vllm-openai:v0.12.0"}}}},
    )
    await fleet.settle()
    east = fleet.get("Deployment", "llama-3-70b-us-east-a100", NS)
    assert east is not None
    assert east["spec"]["replicas"] == 3
    assert east["spec"]["template"]["spec"]["containers"][0]["image"] == "vllm/vllm-openai:v0.12.0"
    for kind, name in (
        ("Deployment", "llama-3-70b-us-west-a100"),
        ("Service", "llama-3-70b-us-west-a100"),
        ("ConfigMap", "llama-3-70b-us-west-a100-fairness"),
    ):
        assert fleet.get(kind, name, NS) is None, f"{kind} {name} should be deleted"
    assert "Deleted" in [e["reason"] for e in fleet.events_for("llama-3-70b", NS)]
    md = fleet.get("ModelDeployment", "llama-3-70b", NS)
    assert md is not None
    assert [r["pool"] for r in md["status"]["regions"]] == ["us-east-a100", "eu-west-h100"]
    assert md["status"]["observedGeneration"] == md["metadata"]["generation"] == 2
    west = fleet.get("RegionPool", "us-west-a100")
    assert west is not None
    assert west["status"]["allocatedGpus"] == 0


async def test_drift_in_children_is_corrected(fleet: RunningOperator) -> None:
    deployment = fleet.get("Deployment", "mistral-7b-us-east-a100", NS)
    assert deployment is not None
    await fleet.patch(
        deployment,
        {"spec": {"replicas": 7, "template": {"spec": {"nodeSelector": {"sneaky": "yes"}}}}},
    )
    await fleet.kube.delete(SERVICES, "mistral-7b-eu-west-h100", NS)
    await fleet.settle()
    deployment = fleet.get("Deployment", "mistral-7b-us-east-a100", NS)
    assert deployment is not None
    assert deployment["spec"]["replicas"] == 2
    assert "sneaky" not in deployment["spec"]["template"]["spec"]["nodeSelector"]
    assert fleet.get("Service", "mistral-7b-eu-west-h100", NS) is not None
    messages = [e["message"] for e in fleet.events_for("mistral-7b", NS)]
    assert any("Deployment mistral-7b-us-east-a100: set spec.replicas" in m for m in messages), (
        messages
    )


async def test_image_pull_secrets_reach_the_serving_pods_and_can_be_cleared(
    fleet: RunningOperator,
) -> None:
    name = "mistral-7b-us-east-a100"
    before = fleet.get("Deployment", name, NS)
    assert before is not None
    assert "imagePullSecrets" not in before["spec"]["template"]["spec"]
    mistral = example("ModelDeployment", "mistral-7b")
    await fleet.patch(mistral, {"spec": {"imagePullSecrets": [{"name": "regcred"}]}})
    await fleet.settle()
    deployment = fleet.get("Deployment", name, NS)
    assert deployment is not None
    assert deployment["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    await fleet.patch(mistral, {"spec": {"imagePullSecrets": []}})
    await fleet.settle()
    deployment = fleet.get("Deployment", name, NS)
    assert deployment is not None
    assert not deployment["spec"]["template"]["spec"].get("imagePullSecrets")


async def test_pool_change_reaches_every_user(fleet: RunningOperator) -> None:
    pool = example("RegionPool", "eu-west-h100")
    await fleet.patch(
        pool, {"spec": {"nodeSelector": {"node.kubernetes.io/instance-type": "a3-highgpu-8g"}}}
    )
    await fleet.settle()
    for name in ("llama-3-70b-eu-west-h100", "mistral-7b-eu-west-h100"):
        deployment = fleet.get("Deployment", name, NS)
        assert deployment is not None
        selector = deployment["spec"]["template"]["spec"]["nodeSelector"]
        # Merge patches would keep old keys; the operator owns the map and replaces it whole.
        assert selector == {
            "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
            "topology.kubernetes.io/region": "europe-west4",
            "node.kubernetes.io/instance-type": "a3-highgpu-8g",
        }


async def test_ready_pods_make_the_model_deployment_ready(fleet: RunningOperator) -> None:
    """No controller-manager runs here, so the test plays it: it writes Deployment status."""
    for deployment in fleet.list("Deployment", NS, f"{naming.MODEL_DEPLOYMENT_LABEL}=mistral-7b"):
        replicas = deployment["spec"]["replicas"]
        await fleet.kube.merge_patch(
            DEPLOYMENTS,
            deployment["metadata"]["name"],
            {
                "status": {
                    "observedGeneration": deployment["metadata"]["generation"],
                    "replicas": replicas,
                    "updatedReplicas": replicas,
                    "readyReplicas": replicas,
                }
            },
            NS,
            "status",
        )
    await fleet.settle()
    md = fleet.get("ModelDeployment", "mistral-7b", NS)
    assert md is not None
    assert md["status"]["readyInstances"] == 3
    assert condition(md, "Ready")["status"] == "True"
    assert condition(md, "Progressing")["status"] == "False"


async def test_delete_cleans_up_children_and_pool_allocations(fleet: RunningOperator) -> None:
    await fleet.kube.delete(MODEL_DEPLOYMENTS, "llama-3-70b", NS)
    await fleet.settle()
    selector = f"{naming.MODEL_DEPLOYMENT_LABEL}=llama-3-70b"
    for kind in ("Deployment", "Service", "ConfigMap"):
        assert fleet.list(kind, NS, selector) == []
    pool = fleet.get("RegionPool", "us-east-a100")
    assert pool is not None
    assert [a["modelDeployment"] for a in pool["status"]["allocations"]] == [f"{NS}/mistral-7b"]
    policy = fleet.get("TenantPolicy", "enterprise", NS)
    assert policy is not None
    assert condition(policy, "Ready")["reason"] == "NoModelDeploymentsSelected"


async def test_missing_pool_gives_a_condition_and_a_warning_event(op: RunningOperator) -> None:
    md = example("ModelDeployment", "mistral-7b")
    md["spec"]["regions"] = [{"pool": "nowhere", "maxInstances": 2}]
    await op.apply([md])
    await op.settle()
    stored = op.get("ModelDeployment", "mistral-7b", NS)
    degraded = condition(stored, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "PoolNotFound")
    assert "RegionPool nowhere does not exist" in degraded["message"]
    assert condition(stored, "Ready")["status"] == "False"
    warnings = [e for e in op.events_for("mistral-7b", NS) if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["PoolNotFound"]
    assert op.list("Deployment", NS) == []

    # The pool appears: the ModelDeployment recovers without anyone touching it.
    await op.apply([{**example("RegionPool", "us-east-a100"), "metadata": {"name": "nowhere"}}])
    await op.settle()
    stored = op.get("ModelDeployment", "mistral-7b", NS)
    assert condition(stored, "Degraded")["status"] == "False"
    assert op.get("Deployment", "mistral-7b-nowhere", NS) is not None


async def test_overcommitted_pool_and_policy_conflict_are_reported(op: RunningOperator) -> None:
    pool = example("RegionPool", "us-east-a100")
    pool["spec"]["capacity"] = {"gpus": 8}
    first = example("ModelDeployment", "llama-3-70b")
    first["spec"]["regions"] = [{"pool": "us-east-a100", "minInstances": 2, "maxInstances": 4}]
    await op.apply([pool, first])
    await op.settle()
    second = example("ModelDeployment", "mistral-7b")
    second["metadata"]["labels"] = dict(first["metadata"]["labels"])
    second["spec"]["regions"] = [{"pool": "us-east-a100", "minInstances": 1, "maxInstances": 4}]
    vtc = example("TenantPolicy", "enterprise")
    clash = copy.deepcopy(vtc)
    clash["metadata"]["name"] = "enterprise-copy"
    await op.apply([second, vtc])
    await op.settle()
    await op.apply([clash])
    await op.settle()

    late = op.get("ModelDeployment", "mistral-7b", NS)
    degraded = condition(late, "Degraded")
    assert degraded["status"] == "True"
    assert "cannot hold 1 more instances" in degraded["message"]
    assert "enterprise (the oldest) applies" in degraded["message"]
    assert (
        condition(op.get("ModelDeployment", "llama-3-70b", NS), "Degraded")["reason"]
        == "TenantPolicyConflict"
    )
    assert condition(op.get("RegionPool", "us-east-a100"), "Degraded")["reason"] == "Overcommitted"
    assert (
        condition(op.get("TenantPolicy", "enterprise-copy", NS), "Degraded")["reason"]
        == "TenantPolicyConflict"
    )
    # Pods still get created: capacity problems are reported, not hidden by clamping replicas.
    assert op.get("Deployment", "mistral-7b-us-east-a100", NS) is not None


async def served_name_canary(op: RunningOperator) -> dict[str, Any]:
    """llama-3-70b, then a canary of it serving the same name in us-east; the canary's body."""
    first = example("ModelDeployment", "llama-3-70b")
    await op.apply([o for o in example_objects() if o["kind"] == "RegionPool"])
    await op.apply([first])
    await op.settle()
    canary = copy.deepcopy(first)
    canary["metadata"]["name"] = "llama-3-70b-canary"
    canary["spec"]["regions"] = [{"pool": "us-east-a100", "minInstances": 1, "maxInstances": 2}]
    await op.apply([canary])
    await op.settle()
    return canary


async def test_a_second_model_deployment_serving_the_same_name_in_a_region_is_told(
    op: RunningOperator,
) -> None:
    """Signals are keyed by served model and region: the later of two that share them is
    Degraded/ServedNameConflict (the first is not), and renaming its servedName clears it."""
    canary = await served_name_canary(op)
    degraded = condition(op.get("ModelDeployment", "llama-3-70b-canary", NS), "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ServedNameConflict")
    assert (
        f"{NS}/llama-3-70b (older) also serves model 'llama-3-70b' in us-east"
        in (degraded["message"])
    )
    assert condition(op.get("ModelDeployment", "llama-3-70b", NS), "Degraded")["status"] == "False"

    canary["spec"]["model"]["servedName"] = "llama-3-70b-canary"
    await op.apply([canary])
    await op.settle()
    degraded = condition(op.get("ModelDeployment", "llama-3-70b-canary", NS), "Degraded")
    assert degraded["status"] == "False"


async def test_invalid_spec_that_slipped_past_the_schema_is_reported(op: RunningOperator) -> None:
    """An object created without the CRD's CEL checks (e.g. an old API server) must not crash it."""
    md = example("ModelDeployment", "mistral-7b")
    md["spec"]["regions"] = [{"pool": "us-east-a100", "minInstances": 5, "maxInstances": 2}]
    await op.apply([md])
    await op.settle()
    degraded = condition(op.get("ModelDeployment", "mistral-7b", NS), "Degraded")
    assert degraded["reason"] == "InvalidSpec"
    assert "minInstances must be <= maxInstances" in degraded["message"]


async def test_operator_creates_its_peering_object() -> None:
    async with KubeEmulator() as emulator, running_operator(emulator) as running:
        created = await ensure_peering(running.kube, OperatorSettings(peering_name="fleetwarden"))
        assert created is True
        assert emulator.get("kopf.dev", "v1", "clusterkopfpeerings", "fleetwarden") is not None
        # Idempotent: a second replica starting finds it and creates nothing.
        mark = emulator.mark()
        assert await ensure_peering(running.kube, OperatorSettings(peering_name="fleetwarden"))
        assert emulator.writes_since(mark) == []
        namespaced = OperatorSettings(peering_name="fw", namespaces=(NS,))
        assert await ensure_peering(running.kube, namespaced)
        assert emulator.get("kopf.dev", "v1", "kopfpeerings", "fw", NS) is not None
