"""Why each field of the child objects looks as it does."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fleetwarden.cli import build_parser
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.operator import builders, naming
from fleetwarden.operator.drift import drifted_paths, merge_patch_for
from fleetwarden.operator.spot_deployments import build_spot_deployment
from tests.operator.fixtures import region_target

ROOT = Path(__file__).resolve().parents[2]


def test_deployment_lands_on_the_pools_nodes_with_its_gpus() -> None:
    target = region_target()
    deployment = builders.build_deployment(target)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == target.pool.node_selector
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    engine = pod["containers"][0]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "4"  # gpusPerInstance
    assert engine["resources"]["requests"]["nvidia.com/gpu"] == "4"
    assert "--tensor-parallel-size" in engine["args"]
    # The user's engine args come last, so they can override the operator's.
    assert engine["args"][-3:] == ["--max-model-len", "16384", "--enable-prefix-caching"]
    spread = pod["topologySpreadConstraints"][0]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    assert spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_replicas_and_owner_reference() -> None:
    deployment = builders.build_deployment(region_target(replicas=3))
    assert deployment["spec"]["replicas"] == 3
    (owner,) = deployment["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "fleetwarden.dev/v1alpha1",
        "kind": "ModelDeployment",
        "name": "llama-3-70b",
        "uid": "u-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_engine_startup_probe_allows_the_pools_load_time() -> None:
    """A liveness kill during weight loading would restart a GPU pod forever."""
    target = region_target()
    engine = builders.build_deployment(target)["spec"]["template"]["spec"]["containers"][0]
    probe = engine["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= target.pool.model_load_seconds


def test_sidecar_proxies_to_the_engine_and_reads_the_config_map() -> None:
    target = region_target()
    pod = builders.build_deployment(target)["spec"]["template"]["spec"]
    sidecar = pod["containers"][1]
    assert sidecar["image"] == "example/sidecar:1"
    assert sidecar["args"][sidecar["args"].index("--engine-url") + 1] == "http://127.0.0.1:8000"
    config_volume = next(v for v in pod["volumes"] if v["name"] == "fairness-config")
    assert config_volume["configMap"]["name"] == target.config_map
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    assert "nvidia.com/gpu" not in json.dumps(sidecar["resources"])


def test_sidecar_bounds_reach_its_flags_only_when_set() -> None:
    """Default bounds add no flag: an operator upgrade must not change every pod template (a
    rollout of every GPU pod). Set ones become flags the sidecar's own parser accepts."""
    plain = builders.build_deployment(region_target())["spec"]["template"]["spec"]["containers"][1]
    assert not any(a.startswith(("--forget", "--max")) for a in plain["args"])
    target = region_target()
    sidecar = target.spec.sidecar.model_copy(
        update={"forget_idle_tenants_seconds": 120.5, "max_tenant_labels": 50}
    )
    target = replace(target, spec=target.spec.model_copy(update={"sidecar": sidecar}))
    args = builders.build_deployment(target)["spec"]["template"]["spec"]["containers"][1]["args"]
    parsed = build_parser().parse_args(args)
    assert (parsed.forget_idle_tenants_after, parsed.max_tenant_labels) == (120.5, 50)
    assert args[: len(plain["args"])] == plain["args"]


def test_config_version_is_not_in_the_pod_template() -> None:
    """Config changes are pushed live; a template change would restart GPU pods for nothing."""
    deployment = builders.build_deployment(region_target())
    assert naming.CONFIG_VERSION_ANNOTATION not in json.dumps(deployment["spec"]["template"])


def test_service_selects_the_deployments_pods_and_exposes_metrics() -> None:
    target = region_target()
    service = builders.build_service(target)
    deployment = builders.build_deployment(target)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert {p["name"] for p in service["spec"]["ports"]} == {"http", "metrics"}
    labels = service["metadata"]["labels"]
    assert labels[naming.MANAGED_BY] == "fleetwarden"
    assert labels[naming.COMPONENT] == "serving"  # what the chart's ServiceMonitor selects


def test_config_map_holds_a_parseable_versioned_config() -> None:
    target = region_target()
    config_map = builders.build_config_map(target)
    document = config_map["data"]["fairness.json"]
    assert json.loads(document)["version"] == target.config_version
    assert FairnessConfig.from_document(document).version == target.config_version
    assert (
        config_map["metadata"]["annotations"][naming.CONFIG_VERSION_ANNOTATION]
        == target.config_version
    )


@pytest.mark.parametrize("length", [10, 40, 60, 120, 250])
def test_child_names_are_valid_dns_labels_and_stable(length: int) -> None:
    name = naming.child_name("m" * length, "pool-a")
    config = naming.config_map_name("m" * length, "pool-a")
    for value in (name, config):
        assert len(value) <= 63
        assert value[0].isalnum()
        assert value[-1].isalnum()
    assert name == naming.child_name("m" * length, "pool-a")
    assert naming.child_name("m" * length, "pool-a") != naming.child_name("m" * length, "pool-b")


def test_serving_pods_mount_no_service_account_token() -> None:
    """Neither vLLM nor the sidecar calls the Kubernetes API; a mounted token would only be a
    credential for whoever breaks into the pod (the spot pods are the same pods)."""
    pod = builders.build_deployment(region_target())["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    spot = build_spot_deployment(region_target(), 1)["spec"]["template"]["spec"]
    assert spot["automountServiceAccountToken"] is False
    # What makes that safe: nothing the sidecar runs reaches for the API or a token.
    sidecar_sources = (ROOT / "fleetwarden" / "sidecar").rglob("*.py")
    for path in sidecar_sources:
        text = path.read_text(encoding="utf-8")
        for needle in ("import kubernetes", "import kopf", "serviceaccount", "KUBERNETES_SERVICE"):
            assert needle not in text, f"{path.name} uses {needle}"


def test_sidecar_runs_under_the_runtime_default_seccomp_profile() -> None:
    containers = builders.build_deployment(region_target())["spec"]["template"]["spec"][
        "containers"
    ]
    engine, sidecar = containers
    assert sidecar["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # The engine's context is the engine image's business (vLLM needs what it needs).
    assert "securityContext" not in engine


def test_image_pull_secrets_reach_the_pods_only_when_set() -> None:
    """An unset field leaves the pod template exactly as before the field existed (an operator
    upgrade must not roll every GPU pod); `[]` is passed on so it can remove earlier secrets."""
    unset = builders.build_deployment(region_target())["spec"]["template"]
    assert "imagePullSecrets" not in unset["spec"]
    explicit_null = builders.build_deployment(region_target(imagePullSecrets=None))
    assert json.dumps(explicit_null["spec"]["template"]) == json.dumps(unset)
    with_secret = region_target(imagePullSecrets=[{"name": "regcred"}, {"name": "mirror.pull"}])
    pod = builders.build_deployment(with_secret)["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror.pull"}]
    assert {k: v for k, v in pod.items() if k != "imagePullSecrets"} == unset["spec"]
    spot = build_spot_deployment(with_secret, 1)["spec"]["template"]["spec"]
    assert spot["imagePullSecrets"] == pod["imagePullSecrets"]
    cleared = builders.build_deployment(region_target(imagePullSecrets=[]))
    assert cleared["spec"]["template"]["spec"]["imagePullSecrets"] == []


def test_pull_secrets_removed_from_the_spec_are_removed_from_the_deployment() -> None:
    """What the applier does with the three states against a live Deployment."""
    before = builders.build_deployment(region_target())
    live = builders.build_deployment(region_target(imagePullSecrets=[{"name": "regcred"}]))
    # Unset: a live Deployment without secrets is not drift (no patch, no rollout) ...
    assert drifted_paths(before, before) == []
    # ... and one with secrets (set before, or by hand) is left alone.
    assert drifted_paths(before, live) == []
    # `[]`: drift only where secrets are set, and the patch clears them.
    cleared = builders.build_deployment(region_target(imagePullSecrets=[]))
    assert drifted_paths(cleared, before) == []
    assert drifted_paths(cleared, live) == [".spec.template.spec.imagePullSecrets"]
    patch = merge_patch_for(cleared, live)
    assert patch["spec"]["template"]["spec"]["imagePullSecrets"] == []
