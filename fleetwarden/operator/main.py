"""Run the operator: settings, the Kopf registry, startup, leader election, and the entry point.

Leader election is Kopf peering: every replica heartbeats into a peering object, and only the one
with the highest priority acts. Replicas of equal priority would all pause, so each derives a
distinct, stable priority from its pod name. The operator creates its peering object itself when
it is missing (Helm cannot create an object of a CRD installed in the same release).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf

from fleetwarden.metrics.client import PrometheusClient
from fleetwarden.operator.autoscaler import Autoscaler
from fleetwarden.operator.events import KopfEvents
from fleetwarden.operator.handlers import (
    children,
    indices,
    modeldeployment,
    regionpool,
    tenantpolicy,
)
from fleetwarden.operator.hourly_planner import FleetPlanner
from fleetwarden.operator.kube import (
    CLUSTER_PEERINGS,
    NAMESPACED_PEERINGS,
    ConflictError,
    KubeApiError,
    KubeClient,
)
from fleetwarden.operator.metrics_poller import MetricsPoller
from fleetwarden.operator.naming import FIELD_MANAGER
from fleetwarden.operator.plan_status import PlanBook
from fleetwarden.operator.reconcilers.context import Context
from fleetwarden.operator.runtime import Runtime
from fleetwarden.scaling.config import METRICS_POLL_INTERVAL_S

logger = logging.getLogger(__name__)

ANNOTATION_PREFIX = "fleetwarden.dev"
MAX_PRIORITY = 1_000_000


@dataclass(frozen=True)
class OperatorSettings:
    """Command-line settings of one operator process."""

    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty watches the whole cluster."""
    peering_name: str | None = "fleetwarden"
    """Kopf peering object for leader election; None runs standalone (one replica only!)."""
    priority: int | None = None
    """Peering priority; None derives it from $POD_NAME so replicas never tie."""
    liveness_endpoint: str | None = None
    """e.g. http://0.0.0.0:8080/healthz; None serves no probe endpoint."""
    sidecar_image: str = "ghcr.io/fleetwarden/fleetwarden:0.1.0"
    """Image of the scheduler sidecar when a ModelDeployment does not name one."""
    resync_seconds: float = 60.0
    """Each object is reconciled at least this often, events or not (drift repair backstop)."""
    prometheus_url: str | None = None
    """Prometheus with the sidecars' metrics; None disables scaling (replicas hold)."""
    metrics_interval_seconds: float = METRICS_POLL_INTERVAL_S
    """Seconds between two reads of utilisation and load from Prometheus."""
    forecast_refit_hours: float = 0.0
    """Refit each (model, region)'s ARIMA parameters this often and only filter new data with
    them in between (`forecasting.warm`); 0 fits fresh every round."""

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces


def peering_priority(pod_name: str | None) -> int:
    """A stable priority in [1, MAX_PRIORITY] from the pod name (0 without one)."""
    if not pod_name:
        return 0
    digest = hashlib.sha256(pod_name.encode()).digest()
    return 1 + int.from_bytes(digest[:8], "big") % MAX_PRIORITY


def now_rfc3339() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def build_registry(settings: OperatorSettings) -> kopf.OperatorRegistry:
    """Every handler, in a registry of its own (importing twice never registers twice)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(id="fleetwarden-login", registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A private registry has none of Kopf's default login handlers: without this, the
        # operator cannot authenticate at all. In-cluster service account first, then kubeconfig.
        info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
        return info or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(id="fleetwarden-startup", registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
        _configure_kopf(settings)
        if getattr(memo, "runtime", None) is None:
            kube = await KubeClient.connect()
            runtime = Runtime(
                Context(
                    kube=kube,
                    events=KopfEvents(),
                    sidecar_image=operator_settings.sidecar_image,
                    now=now_rfc3339,
                    autoscaler=Autoscaler() if operator_settings.prometheus_url else None,
                    plans=PlanBook() if operator_settings.prometheus_url else None,
                )
            )
            memo.runtime = runtime
            memo.resync = asyncio.get_running_loop().create_task(
                runtime.resync_forever(operator_settings.resync_seconds), name="resync"
            )
            if runtime.context.autoscaler is not None and operator_settings.prometheus_url:
                poller = MetricsPoller(
                    client=PrometheusClient(operator_settings.prometheus_url),
                    autoscaler=runtime.context.autoscaler,
                    view=runtime.view,
                    request_reconcile=runtime.model_deployments.request,
                    interval_s=operator_settings.metrics_interval_seconds,
                )
                memo.poller = asyncio.get_running_loop().create_task(
                    poller.run_forever(), name="metrics-poller"
                )
                # One planner for the whole fleet (pools are shared; see hourly_planner.py).
                assert runtime.context.plans is not None
                planner = FleetPlanner(
                    client=PrometheusClient(operator_settings.prometheus_url),
                    autoscaler=runtime.context.autoscaler,
                    book=runtime.context.plans,
                    view=runtime.view,
                    request_reconcile=runtime.model_deployments.request,
                    refit_every_s=operator_settings.forecast_refit_hours * 3600.0,
                )
                memo.planner = asyncio.get_running_loop().create_task(
                    planner.run_forever(), name="hourly-planner"
                )

    @kopf.on.cleanup(id="fleetwarden-cleanup", registry=registry)
    async def cleanup(memo: Any, **_: Any) -> None:
        # Stop in order: no new requests, in-flight reconciles unwound, then the client closed.
        for name in ("resync", "poller", "planner"):
            task = getattr(memo, name, None)
            if isinstance(task, asyncio.Task):
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        runtime = getattr(memo, "runtime", None)
        if isinstance(runtime, Runtime):
            await runtime.stop()
            await runtime.context.kube.close()

    operator_settings = settings
    indices.register(registry)
    modeldeployment.register(registry)
    regionpool.register(registry)
    tenantpolicy.register(registry)
    children.register(registry)
    return registry


def _configure_kopf(settings: kopf.OperatorSettings) -> None:
    """Keep Kopf's own bookkeeping under our prefix and off the user's spec and status, and its
    watches of the child kinds on the operator's own objects."""
    settings.persistence.finalizer = f"{ANNOTATION_PREFIX}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 30
    settings.admission.managed = None
    settings.execution.max_workers = 4
    children.configure_watching(settings)


async def ensure_peering(kube: KubeClient, settings: OperatorSettings) -> bool:
    """Create the peering object(s) if missing; False when the peering CRD is not installed."""
    if settings.peering_name is None:
        return False
    metadata = {
        "name": settings.peering_name,
        "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER},
    }
    bodies: list[dict[str, Any]] = (
        [{"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": metadata}]
        if settings.clusterwide
        else [
            {
                "apiVersion": "kopf.dev/v1",
                "kind": "KopfPeering",
                "metadata": {**metadata, "namespace": ns},
            }
            for ns in settings.namespaces
        ]
    )
    kind = CLUSTER_PEERINGS if settings.clusterwide else NAMESPACED_PEERINGS
    for body in bodies:
        namespace = body["metadata"].get("namespace")
        try:
            if await kube.get(kind, settings.peering_name, namespace) is None:
                await kube.create(body)
        except ConflictError:
            pass  # another replica created it first
        except KubeApiError as exc:
            if exc.status == 404:
                return False
            raise
    return True


async def run_async(settings: OperatorSettings, *, stop_flag: asyncio.Event | None = None) -> None:
    """Run until stopped: leader election first, then Kopf with our registry."""
    kube = await KubeClient.connect()
    try:
        peering = await ensure_peering(kube, settings)
    finally:
        await kube.close()
    if settings.peering_name is not None and not peering:
        logger.warning(
            "Kopf peering CRD is not installed: running standalone; do not run two replicas"
        )
    priority = settings.priority
    if priority is None:
        priority = peering_priority(os.environ.get("POD_NAME"))
    await kopf.operator(
        registry=build_registry(settings),
        clusterwide=settings.clusterwide,
        namespaces=list(settings.namespaces),
        standalone=not peering,
        peering_name=settings.peering_name if peering else None,
        priority=priority,
        liveness_endpoint=settings.liveness_endpoint,
        memo=kopf.Memo(),
        stop_flag=stop_flag,
    )


def run(settings: OperatorSettings) -> None:
    """Entry point of `fleetwarden operator`."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(run_async(settings))
