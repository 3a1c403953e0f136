"""Why each field of the child objects looks as it does."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec, RegionPoolSpec
from fleetwarden.cli import build_parser
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.operator import builders, naming
from fleetwarden.operator.fairness_render import render_fairness_config
from tests.operator.fixtures import example


def _target(pool_name: str = "us-east-a100", replicas: int = 2) -> builders.RegionTarget:
    md = ModelDeploymentSpec.model_validate(example("ModelDeployment", "llama-3-70b")["spec"])
    pool = RegionPoolSpec.model_validate(example("RegionPool", pool_name)["spec"])
    placement = next(p for p in md.regions if p.pool == pool_name)
    config = render_fairness_config(md, None)
    return builders.RegionTarget(
        owner=builders.Owner(name="llama-3-70b", namespace="llm-serving", uid="u-1"),
        spec=md,
        placement=placement,
        pool=pool,
        replicas=replicas,
        sidecar_image="example/sidecar:1",
        config_document=config.to_document(),
        config_version=config.version,
    )


def test_deployment_lands_on_the_pools_nodes_with_its_gpus() -> None:
    target = _target()
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
    deployment = builders.build_deployment(_target(replicas=3))
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
    target = _target()
    engine = builders.build_deployment(target)["spec"]["template"]["spec"]["containers"][0]
    probe = engine["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= target.pool.model_load_seconds


def test_sidecar_proxies_to_the_engine_and_reads_the_config_map() -> None:
    target = _target()
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
    plain = builders.build_deployment(_target())["spec"]["template"]["spec"]["containers"][1]
    assert not any(a.startswith(("--forget", "--max")) for a in plain["args"])
    target = _target()
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
    deployment = builders.build_deployment(_target())
    assert naming.CONFIG_VERSION_ANNOTATION not in json.dumps(deployment["spec"]["template"])


def test_service_selects_the_deployments_pods_and_exposes_metrics() -> None:
    target = _target()
    service = builders.build_service(target)
    deployment = builders.build_deployment(target)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert {p["name"] for p in service["spec"]["ports"]} == {"http", "metrics"}
    labels = service["metadata"]["labels"]
    assert labels[naming.MANAGED_BY] == "fleetwarden"
    assert labels[naming.COMPONENT] == "serving"  # what the chart's ServiceMonitor selects


def test_config_map_holds_a_parseable_versioned_config() -> None:
    target = _target()
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
