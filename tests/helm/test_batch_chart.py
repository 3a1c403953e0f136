"""The chart's batch service, rendered and linted by real Helm (helm-python-sdk), offline.

Why each object looks as it does: SQLite means one replica, a PersistentVolumeClaim and strategy
Recreate (two pods must never open one database); Redis means no claim and several replicas;
tokens only ever come from a Secret; the rendered config is one the service itself accepts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from fleetwarden.batch.config import BatchServiceConfig
from fleetwarden.batch.records import QueueKey
from tests.support.helm_render import find_object, lint_chart, render_chart, validate_objects

NAME = "fleetwarden-batch"
TARGETS = [
    {
        "model": "llama-3-70b",
        "region": "us-west",
        "base_url": "http://llama-3-70b-us-west-a100.llm-serving.svc",
        "utilisation": {
            "kind": "prometheus",
            "url": "http://prometheus.monitoring:9090",
            "query": 'fleetwarden_kv_cache_utilization{model="$model",region="$region"}',
        },
    },
    {
        "model": "llama-3-70b",
        "region": "us-west",
        "kind": "spot",
        "base_url": "http://llama-3-70b-us-west-a100-spot.llm-serving.svc",
    },
]
SQLITE: dict[str, Any] = {
    "batch": {"enabled": True, "secret": {"name": "batch-tokens"}, "config": {"targets": TARGETS}}
}
REDIS: dict[str, Any] = {
    "batch": {
        "enabled": True,
        "store": "redis",
        "secret": {"name": "batch-tokens"},
        "redis": {"url": "redis://redis-master.redis:6379/0"},
        "config": {"targets": TARGETS, "dispatch": {"signal_interval_s": 2.0}},
    }
}


def batch_objects(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        obj["kind"]: obj
        for obj in render_chart(values)
        if obj["metadata"]["name"] == NAME
        or obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "batch"
    }


def rendered_config(objects: dict[str, dict[str, Any]], tmp_path: Path) -> BatchServiceConfig:
    """The ConfigMap's file plus a token overlay, loaded by the service's own loader."""
    config = tmp_path / "batch.yaml"
    config.write_text(objects["ConfigMap"]["data"]["batch.yaml"])
    overlay = tmp_path / "secret.yaml"
    overlay.write_text(yaml.safe_dump({"auth": {"tokens": {"sk-a": "team-a"}}}))
    return BatchServiceConfig.load(config, [overlay])


def test_disabled_by_default() -> None:
    """Nothing of the batch service renders on defaults: it cannot run without tokens."""
    assert batch_objects({}) == {}


def test_sqlite_runs_one_replica_on_a_kept_claim_and_recreates(tmp_path: Path) -> None:
    objects = batch_objects({**SQLITE, "batch": {**SQLITE["batch"], "replicaCount": 3}})
    assert set(objects) == {"ConfigMap", "Service", "PersistentVolumeClaim", "Deployment"}
    deployment = objects["Deployment"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    claim = objects["PersistentVolumeClaim"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == NAME
    assert volumes["secret"]["secret"]["secretName"] == "batch-tokens"
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    config = rendered_config(objects, tmp_path)
    assert config.store.kind == "sqlite"
    assert str(config.store.path).startswith(mounts["data"])
    assert config.dispatch.single_replica is True
    assert config.queues() == [QueueKey("llama-3-70b", "us-west")]
    assert set(config.auth.digests().values()) == {"team-a"}


def test_existing_claim_is_used_instead_of_a_new_one() -> None:
    values = {"batch": {**SQLITE["batch"], "sqlite": {"existingClaim": "old-queue"}}}
    objects = batch_objects(values)
    assert "PersistentVolumeClaim" not in objects
    volumes = objects["Deployment"]["spec"]["template"]["spec"]["volumes"]
    claims = [
        v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v
    ]
    assert claims == ["old-queue"]


def test_redis_has_no_claim_and_runs_replicas(tmp_path: Path) -> None:
    objects = batch_objects(REDIS)
    assert set(objects) == {"ConfigMap", "Service", "Deployment"}
    deployment = objects["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    assert "strategy" not in deployment["spec"]  # rolling: replicas share Redis, not a volume
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert not any("persistentVolumeClaim" in v for v in volumes)
    config = rendered_config(objects, tmp_path)
    assert config.store.kind == "redis"
    assert config.store.url == "redis://redis-master.redis:6379/0"
    # Several replicas share the store: none may re-queue the others' leases at startup.
    assert config.dispatch.single_replica is False
    assert config.dispatch.signal_interval_s == 2.0


def test_probes_resources_and_service_point_at_the_api() -> None:
    objects = batch_objects(SQLITE)
    pod = objects["Deployment"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert set(container["resources"]) == {"requests", "limits"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    service = objects["Service"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    # The operator's Deployment selects its pods by name and instance: never the batch pods.
    operator = find_object(render_chart(SQLITE), "Deployment", "fleetwarden")
    selector = operator["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= pod["metadata"]["labels"].items()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"batch": {"enabled": True}}, "batch.secret.name is required"),
        (
            {"batch": {"enabled": True, "store": "redis", "secret": {"name": "t"}}},
            "batch.redis.url is required",
        ),
    ],
)
def test_missing_required_settings_fail_the_render(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmError, match=message):
        render_chart(values)


def test_schema_rejects_an_unknown_store() -> None:
    with pytest.raises(helm_python.HelmValuesError, match="/batch/store"):
        render_chart({"batch": {"enabled": True, "store": "postgres"}})


@pytest.mark.parametrize("values", [SQLITE, REDIS], ids=["sqlite", "redis"])
def test_lint_and_kubernetes_schemas_pass(values: dict[str, Any]) -> None:
    report = lint_chart(values, strict=True)
    assert report.ok, report
    objects = [o for o in render_chart(values) if o["kind"] != "ServiceMonitor"]
    assert validate_objects(objects, "1.30.0") == []
