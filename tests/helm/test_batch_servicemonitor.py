"""With `serviceMonitor.enabled` and `batch.enabled`, the chart has Prometheus scrape the batch
service, rendered by real Helm (helm-python-sdk), offline.

The planner's NIW buffer (beta) and the spot Deployments' sizing read the batch service's
`fleetwarden_niw_*` metrics from Prometheus. The chart's only ServiceMonitor selected the serving
Services the operator makes (`managed-by=fleetwarden, component=serving`); the batch Service is
`managed-by=Helm, component=batch`, and the pods' `prometheus.io/*` annotations mean nothing to
the Prometheus Operator. So the batch service was never scraped: spot stayed at 0 and beta added 0.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.helm_render import (
    DEFAULT_NAMESPACE,
    find_object,
    lint_chart,
    objects_of_kind,
    render_chart,
    validate_objects,
)

BATCH: dict[str, Any] = {
    "enabled": True,
    "secret": {"name": "batch-tokens"},
    "config": {
        "targets": [
            {"model": "m", "region": "r", "kind": "spot", "base_url": "http://m-r-spot.serving"}
        ]
    },
}
MONITOR: dict[str, Any] = {"enabled": True, "interval": "15s", "labels": {"release": "prom"}}
BOTH: dict[str, Any] = {"serviceMonitor": MONITOR, "batch": BATCH}


def selects(monitor: dict[str, Any], service: dict[str, Any]) -> bool:
    """Whether the Prometheus Operator makes targets of `service` from `monitor`: the namespace
    selector, the label selector (matchLabels only; the chart uses nothing else) and at least one
    endpoint naming one of the Service's ports."""
    spec = monitor["spec"]
    namespaces = spec.get("namespaceSelector", {})
    namespace = service["metadata"]["namespace"]
    if namespaces.get("any") is not True:
        allowed = namespaces.get("matchNames") or [monitor["metadata"]["namespace"]]
        if namespace not in allowed:
            return False
    assert set(spec["selector"]) == {"matchLabels"}
    wanted = spec["selector"]["matchLabels"].items()
    if not wanted <= service["metadata"].get("labels", {}).items():
        return False
    ports = {port["name"] for port in service["spec"]["ports"]}
    return any(endpoint["port"] in ports for endpoint in spec["endpoints"])


def batch_service(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (service,) = [
        s
        for s in objects_of_kind(objects, "Service")
        if s["metadata"]["labels"].get("app.kubernetes.io/component") == "batch"
    ]
    return service


@pytest.mark.parametrize(
    ("release", "namespace", "extra"),
    [
        ("fleetwarden", DEFAULT_NAMESPACE, {}),
        ("prod", "ml-batch", {"nameOverride": "fw", "batch": {**BATCH, "port": 9100}}),
    ],
    ids=["defaults", "renamed"],
)
def test_one_service_monitor_scrapes_the_batch_metrics_port(
    release: str, namespace: str, extra: dict[str, Any]
) -> None:
    objects = render_chart({**BOTH, **extra}, namespace=namespace, release=release)
    service = batch_service(objects)
    monitors = objects_of_kind(objects, "ServiceMonitor")
    (monitor,) = [m for m in monitors if selects(m, service)]
    assert monitor["metadata"]["namespace"] == namespace
    # Only this release's batch Service, in its namespace: another release elsewhere has its own.
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
    assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "batch"
    # The same interval and labels as the sidecars' ServiceMonitor.
    assert monitor["metadata"]["labels"]["release"] == "prom"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {"port": "http", "path": "/metrics", "interval": "15s"}
    # The named port is the one the batch container serves /metrics on (fleetwarden batch's API).
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    deployment = find_object(objects, "Deployment", service["metadata"]["name"])
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    (container_port,) = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    assert (
        container_port["containerPort"]
        == port["port"]
        == extra.get("batch", BATCH).get("port", 8090)
    )
    assert pod["metadata"]["annotations"]["prometheus.io/path"] == endpoint["path"]


def test_the_serving_monitor_is_unchanged_and_does_not_select_the_batch_service() -> None:
    objects = render_chart(BOTH)
    serving = find_object(objects, "ServiceMonitor", "fleetwarden-serving")
    assert serving["spec"]["namespaceSelector"] == {"any": True}
    assert not selects(serving, batch_service(objects))  # no double scrape
    batch = find_object(objects, "ServiceMonitor", "fleetwarden-batch")
    assert batch["metadata"]["labels"] == serving["metadata"]["labels"]


@pytest.mark.parametrize(
    "values",
    [{"serviceMonitor": MONITOR}, {"batch": BATCH}],
    ids=["batch-disabled", "service-monitor-disabled"],
)
def test_no_batch_monitor_unless_both_are_enabled(values: dict[str, Any]) -> None:
    names = [m["metadata"]["name"] for m in objects_of_kind(render_chart(values), "ServiceMonitor")]
    assert "fleetwarden-batch" not in names


def test_lint_and_kubernetes_schemas_pass_with_both() -> None:
    report = lint_chart(BOTH, strict=True)
    assert report.ok, report
    objects = render_chart(BOTH)
    skipped = validate_objects(
        objects, "1.30.0", skip_kinds=[("monitoring.coreos.com/v1", "ServiceMonitor")]
    )
    assert len(skipped) == 2
