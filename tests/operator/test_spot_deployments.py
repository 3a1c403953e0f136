"""Spot Deployments follow the NIW backlog that the batch service exports to Prometheus.

Real: Prometheus (Debian's binary, scraping an exporter every second), the batch service's own
`BatchMetrics` exporter code (the test sets its backlog through `observe_backlog`), Kopf, the
operator and `spot_replicas`. Mocked: the cluster (the API emulator; no kubelet, so no pods run).
The first tests are pure: the builders and the sizing, without any server.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec, RegionPoolSpec
from fleetwarden.batch.metrics import BatchMetrics
from fleetwarden.batch.records import QueueBacklog, QueueKey
from fleetwarden.metrics.client import Sample
from fleetwarden.operator import builders, naming
from fleetwarden.operator.fleet import FleetView, ObjectRecord
from fleetwarden.operator.main import OperatorSettings
from fleetwarden.operator.spot_deployments import (
    SPOT_POOL_LABEL,
    build_spot_deployment,
    build_spot_service,
    decide_spot_replicas,
    pool_spot_shares,
    spot_name,
)
from fleetwarden.operator.spot_signals import BacklogSignal, backlog_from_samples
from tests.operator.fixtures import example
from tests.support.eventually import eventually
from tests.support.fleet_operator import RunningOperator, running_operator
from tests.support.kube_emulator import KubeEmulator
from tests.support.prometheus_server import MetricsExporter, PrometheusFactory, prometheus_factory

__all__ = ["prometheus_factory"]
NS = "llm-serving"
POOL = "us-west-a100"
SPOT = "llama-3-70b-us-west-a100-spot"
QUEUE = QueueKey("llama-3-70b", "us-west")
DUE_BUCKETS = (600.0, 3600.0, 86400.0)


def region_target(md: dict[str, Any] | None = None) -> builders.RegionTarget:
    spec = ModelDeploymentSpec.model_validate(
        (md or example("ModelDeployment", "llama-3-70b"))["spec"]
    )
    pool = RegionPoolSpec.model_validate(example("RegionPool", POOL)["spec"])
    placement = next(p for p in spec.regions if p.pool == POOL)
    return builders.RegionTarget(
        owner=builders.Owner("llama-3-70b", NS, "uid-1"),
        spec=spec,
        placement=placement,
        pool=pool,
        replicas=1,
        sidecar_image="fleetwarden:test",
        config_document="{}",
        config_version="v1",
    )


def test_spot_pods_run_on_spot_nodes_and_never_match_the_serving_selectors() -> None:
    target = region_target()
    serving = builders.build_deployment(target)
    spot = build_spot_deployment(target, replicas=3)
    pool = example("RegionPool", POOL)["spec"]

    assert spot["metadata"]["name"] == SPOT
    assert spot["spec"]["replicas"] == 3
    pod = spot["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == pool["spot"]["nodeSelector"]
    for toleration in pool["tolerations"] + pool["spot"]["tolerations"]:
        assert toleration in pod["tolerations"]
    # Same containers and volumes as the serving pods.
    assert pod["containers"] == serving["spec"]["template"]["spec"]["containers"]
    assert pod["volumes"] == serving["spec"]["template"]["spec"]["volumes"]

    spot_pod_labels = spot["spec"]["template"]["metadata"]["labels"]
    serving_selector = serving["spec"]["selector"]["matchLabels"]
    assert not serving_selector.items() <= spot_pod_labels.items()
    assert not builders.build_service(target)["spec"]["selector"].items() <= spot_pod_labels.items()
    assert spot["spec"]["selector"]["matchLabels"].items() <= spot_pod_labels.items()
    assert spot_pod_labels[SPOT_POOL_LABEL] == POOL
    # Not scraped as a serving sidecar: its load would count as the region's interactive load.
    assert "annotations" not in spot["spec"]["template"]["metadata"]
    assert spot_pod_labels[naming.COMPONENT] != naming.SERVING

    service = build_spot_service(target)
    assert service["metadata"]["name"] == SPOT
    assert service["spec"]["selector"] == spot["spec"]["selector"]["matchLabels"]
    # Removing the region removes the spot children with the serving ones.
    assert service["metadata"]["labels"][naming.POOL_LABEL] == POOL


def test_spot_names_stay_within_63_characters() -> None:
    name = spot_name("m" * 60, "pool-with-a-long-name")
    assert len(name) <= 63
    assert name.endswith("-spot")
    assert name == spot_name("m" * 60, "pool-with-a-long-name")


@pytest.mark.parametrize(
    ("open_items", "due", "expected"),
    [
        (0, (), 0),  # nothing queued or running: no spot capacity
        (500, ((3600.0, 500),), 1),  # a light backlog: one replica drains it within the hour
        (20_000, ((600.0, 20_000),), 4),  # deadline pressure: up to niw.spot.maxInstances
    ],
)
def test_spot_replicas_follow_the_backlog_within_the_bounds(
    open_items: int, due: tuple[tuple[float, int], ...], expected: int
) -> None:
    target = region_target()
    signal = BacklogSignal(0.0, open_items, due, tokens_per_item=1024.0)
    assert decide_spot_replicas(target.spec, target.pool, signal) == expected


def test_the_pool_bound_caps_the_model_bound() -> None:
    target = region_target()
    pool = target.pool.model_copy(
        update={"spot": target.pool.spot.model_copy(update={"max_instances": 2})}
    )
    signal = BacklogSignal(0.0, 20_000, ((600.0, 20_000),), tokens_per_item=1024.0)
    assert decide_spot_replicas(target.spec, pool, signal) == 2


def _spot_users(spot_replicas_in_status: int) -> FleetView:
    """The example llama ModelDeployment and a second one (another served model) on POOL."""
    first = example("ModelDeployment", "llama-3-70b")
    second = copy.deepcopy(first)
    second["metadata"]["name"] = "llama-3-8b"
    second["spec"]["model"]["servedName"] = "llama-3-8b"
    second["status"] = {"regions": [{"pool": POOL, "spotReplicas": spot_replicas_in_status}]}
    return FleetView.of(model_deployments=[ObjectRecord.from_body(b) for b in (first, second)])


def test_a_pool_bound_is_shared_by_every_model_deployment_on_the_pool() -> None:
    """Two ModelDeployments each wanting the model maximum (4) on a pool bounded at 3 get 3 in
    all, not 3 each; without the pool bound each gets its own want."""
    pool = region_target().pool
    bounded = pool.model_copy(update={"spot": pool.spot.model_copy(update={"max_instances": 3})})
    pressure = BacklogSignal(0.0, 20_000, ((600.0, 20_000),), tokens_per_item=1024.0)
    view = _spot_users(0)
    shares = pool_spot_shares(view, POOL, bounded, lambda model, region: pressure)
    assert sum(shares.values()) == 3
    assert sorted(shares.values()) == [1, 2]
    assert pool_spot_shares(view, POOL, pool, lambda model, region: pressure) == {
        f"{NS}/llama-3-70b": 4,
        f"{NS}/llama-3-8b": 4,
    }


def test_a_stale_neighbour_holds_its_reported_spot_replicas_within_the_pool_bound() -> None:
    pool = region_target().pool
    bounded = pool.model_copy(update={"spot": pool.spot.model_copy(update={"max_instances": 4})})
    pressure = BacklogSignal(0.0, 20_000, ((600.0, 20_000),), tokens_per_item=1024.0)
    shares = pool_spot_shares(
        _spot_users(1),
        POOL,
        bounded,
        lambda model, region: pressure if model == "llama-3-70b" else None,
    )
    assert shares == {f"{NS}/llama-3-70b": 3, f"{NS}/llama-3-8b": 1}


def test_backlog_readings_join_the_queries() -> None:
    where = {"model": "m", "region": "r"}
    readings = backlog_from_samples(
        7.0,
        open_items=[Sample(where, 7.0, 12.0)],
        due_items=[
            Sample({**where, "within_seconds": "3600"}, 7.0, 10.0),
            Sample({**where, "within_seconds": "600"}, 7.0, 4.0),
        ],
        tokens_per_s=[Sample(where, 7.0, 500.0)],
        items_per_s=[Sample(where, 7.0, 2.0)],
    )
    assert readings == {("m", "r"): BacklogSignal(7.0, 12, ((600.0, 4), (3600.0, 10)), 250.0)}


# End to end -----------------------------------------------------------------------------------


def spot_replicas(op: RunningOperator) -> int | None:
    deployment = op.get("Deployment", SPOT, NS)
    return None if deployment is None else int(deployment["spec"]["replicas"])


def status_region(op: RunningOperator, name: str = "llama-3-70b") -> dict[str, Any]:
    md = op.get("ModelDeployment", name, NS) or {}
    regions = md.get("status", {}).get("regions", [])
    return next((r for r in regions if r["pool"] == POOL), {})


@pytest.fixture
def batch_metrics() -> Iterator[tuple[BatchMetrics, MetricsExporter]]:
    """The batch service's exporter, holding one queue's backlog."""
    metrics = BatchMetrics([QueueKey("llama-3-70b", "us-west")], DUE_BUCKETS)
    with MetricsExporter(metrics.registry) as served:
        yield metrics, served


def heavy_backlog(metrics: BatchMetrics) -> None:
    backlog = QueueBacklog(
        queued=20_000,
        in_flight=0,
        oldest_created_at=time.time(),
        due=((600.0, 20_000), (3600.0, 20_000), (86400.0, 20_000)),
    )
    metrics.observe_backlog({QUEUE: backlog}, time.time())


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_spot_deployment_follows_prometheus_backlog_and_goes_when_disabled(
    prometheus_factory: PrometheusFactory,
    batch_metrics: tuple[BatchMetrics, MetricsExporter],
) -> None:
    metrics, served = batch_metrics
    heavy_backlog(metrics)
    prometheus = prometheus_factory.start(targets={"batch": [served.address]})
    settings = OperatorSettings(
        peering_name=None,
        resync_seconds=3600,
        prometheus_url=prometheus.url,
        metrics_interval_seconds=0.5,
    )
    llama = example("ModelDeployment", "llama-3-70b")
    llama["spec"]["regions"] = [{"pool": POOL, "minInstances": 1, "maxInstances": 2}]
    no_spot = copy.deepcopy(llama)
    no_spot["metadata"]["name"] = "qwen"
    no_spot["spec"]["niw"]["spot"]["enabled"] = False
    objects = [example("RegionPool", POOL), llama, no_spot]

    async with KubeEmulator() as emulator, running_operator(emulator, settings) as op:
        await op.apply(objects)

        # Deadline pressure: the spot Deployment exists on spot nodes, at maxInstances.
        await eventually(lambda: spot_replicas(op) == 4)
        deployment = op.get("Deployment", SPOT, NS)
        assert deployment is not None
        pod = deployment["spec"]["template"]["spec"]
        spot_pool = example("RegionPool", POOL)["spec"]["spot"]
        assert pod["nodeSelector"] == spot_pool["nodeSelector"]
        assert spot_pool["tolerations"][0] in pod["tolerations"]
        await eventually(lambda: op.get("Service", SPOT, NS) is not None)
        await eventually(lambda: status_region(op).get("spotReplicas") == 4)

        # The model without spot gets its serving Deployment only.
        await eventually(lambda: op.get("Deployment", f"qwen-{POOL}", NS) is not None)
        assert op.get("Deployment", f"qwen-{POOL}-spot", NS) is None
        assert "spotReplicas" not in status_region(op, "qwen")

        # The queue drains: zero replicas (the Deployment stays, ready for the next batch).
        metrics.observe_backlog({}, time.time())
        await eventually(lambda: spot_replicas(op) == 0)
        await eventually(lambda: status_region(op).get("spotReplicas") == 0)

        # Spot disabled later: the spot Deployment and Service go, the serving ones stay.
        heavy_backlog(metrics)
        await eventually(lambda: spot_replicas(op) == 4)
        await op.patch(llama, {"spec": {"niw": {"spot": {"enabled": False}}}})
        await eventually(lambda: op.get("Deployment", SPOT, NS) is None)
        await eventually(lambda: op.get("Service", SPOT, NS) is None)
        assert op.get("Deployment", f"llama-3-70b-{POOL}", NS) is not None
        await eventually(lambda: "spotReplicas" not in status_region(op))
