"""Pure builders of the objects one ModelDeployment region becomes: Deployment, Service, ConfigMap.

Everything here is a function of its arguments, so a test can assert why each field looks as it
does and the reconciler can compare the desired object with the live one. The pod template does not
carry the fairness config version: config changes are pushed to live sidecars, and a rollout would
restart GPU pods that take minutes to load their weights.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from fleetwarden.api.v1alpha1 import API_VERSION, RegionPlacement, RegionPoolSpec
from fleetwarden.api.v1alpha1.common import ContainerResources, Toleration
from fleetwarden.api.v1alpha1.modeldeployment import (
    SERVICE_PORT as SERVICE_PORT,  # the port the API keeps `sidecar.port` off; re-exported
)
from fleetwarden.api.v1alpha1.modeldeployment import ModelDeploymentSpec, SidecarSettings
from fleetwarden.fairness.config import CONFIG_FILE_NAME
from fleetwarden.operator import naming

JsonDict = dict[str, Any]

GPU_RESOURCE = "nvidia.com/gpu"
CONFIG_MOUNT = "/etc/fleetwarden"
SECRET_MOUNT = "/etc/fleetwarden-secrets"
ADMIN_TOKEN_KEY = "admin-token"
INTERACTION_SECRET_KEY = "interaction-secret"
SIDECAR_UID = 65532
SIDECAR_GID = 65532
"""The sidecar's user and group (the distroless `nonroot` ones). The pod's fsGroup is the same
group, so the Secret volume's files (mode 0440) belong to a group the sidecar is in, whatever
primary group the runtime would otherwise give it."""
PROBE_PERIOD_S = 10


@dataclass(frozen=True)
class Owner:
    """The ModelDeployment that owns the children (garbage collection follows it)."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> JsonDict:
        """The owner reference on every child. `blockOwnerDeletion` holds a foreground deletion
        of the ModelDeployment until its children are gone; with the OwnerReferencesPermission-
        Enforcement admission plugin (on in OpenShift) setting it needs `update` on
        `modeldeployments/finalizers`, which the chart's operator role grants."""
        return {
            "apiVersion": API_VERSION,
            "kind": "ModelDeployment",
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True)
class RegionTarget:
    """Everything needed to build one region's children."""

    owner: Owner
    spec: ModelDeploymentSpec
    placement: RegionPlacement
    pool: RegionPoolSpec
    replicas: int
    sidecar_image: str
    config_document: str
    config_version: str

    @property
    def name(self) -> str:
        return naming.child_name(self.owner.name, self.placement.pool)

    @property
    def config_map(self) -> str:
        return naming.config_map_name(self.owner.name, self.placement.pool)

    @property
    def labels(self) -> dict[str, str]:
        return naming.child_labels(
            self.owner.name, self.placement.pool, self.pool.region, self.pool.gpu_type
        )

    @property
    def selector(self) -> dict[str, str]:
        return naming.selector_labels(self.owner.name, self.placement.pool)


def _metadata(target: RegionTarget, name: str) -> JsonDict:
    return {
        "name": name,
        "namespace": target.owner.namespace,
        "labels": target.labels,
        "ownerReferences": [target.owner.reference()],
    }


def _tolerations(tolerations: list[Toleration]) -> list[JsonDict]:
    return [t.to_k8s() for t in tolerations]


def _resources(resources: ContainerResources, gpus: int = 0) -> JsonDict:
    amounts: dict[str, str] = {}
    if resources.cpu is not None:
        amounts["cpu"] = resources.cpu
    if resources.memory is not None:
        amounts["memory"] = resources.memory
    if gpus:
        amounts[GPU_RESOURCE] = str(gpus)
    if not amounts:
        return {}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _engine_container(target: RegionTarget) -> JsonDict:
    model = target.spec.model
    engine = model.engine
    args = [
        "--model",
        model.name,
        "--served-model-name",
        target.spec.served_name,
        "--host",
        "0.0.0.0",
        "--port",
        str(engine.port),
    ]
    if model.gpus_per_instance > 1:
        args += ["--tensor-parallel-size", str(model.gpus_per_instance)]
    # Startup may take as long as the pool says loading takes, with 50% slack, before liveness kills it.
    startup_failures = max(3, math.ceil(target.pool.model_load_seconds * 1.5 / PROBE_PERIOD_S))
    return {
        "name": "engine",
        "image": engine.image,
        "args": args + list(engine.args),
        "env": [e.to_k8s() for e in engine.env],
        "ports": [{"name": "engine", "containerPort": engine.port, "protocol": "TCP"}],
        "resources": _resources(engine.resources, gpus=model.gpus_per_instance),
        "startupProbe": {
            "httpGet": {"path": "/health", "port": "engine"},
            "periodSeconds": PROBE_PERIOD_S,
            "failureThreshold": startup_failures,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "engine"},
            "periodSeconds": PROBE_PERIOD_S,
            "failureThreshold": 3,
        },
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }


_SIDECAR_DEFAULTS = SidecarSettings()


def _sidecar_bounds(sidecar: SidecarSettings) -> list[str]:
    """Flags for the bounds set away from their defaults, and only those: a flag added to every
    pod template by an operator upgrade would roll every serving pod (a GPU model reload)."""
    args: list[str] = []
    if sidecar.forget_idle_tenants_seconds != _SIDECAR_DEFAULTS.forget_idle_tenants_seconds:
        args += ["--forget-idle-tenants-after", repr(sidecar.forget_idle_tenants_seconds)]
    if sidecar.max_tenant_labels != _SIDECAR_DEFAULTS.max_tenant_labels:
        args += ["--max-tenant-labels", str(sidecar.max_tenant_labels)]
    if sidecar.passthrough is not None:  # unset: the sidecar's own default list
        for route in sidecar.passthrough or [""]:  # `''` alone: none at all
            args += ["--passthrough", route]
    if sidecar.relay != _SIDECAR_DEFAULTS.relay:
        args += ["--relay", sidecar.relay]
    if sidecar.relay_nice is not None:  # unset: the sidecar's own default
        args += ["--relay-nice", str(sidecar.relay_nice)]
    return args


def _sidecar_container(target: RegionTarget) -> JsonDict:
    sidecar = target.spec.sidecar
    return {
        "name": "sidecar",
        "image": sidecar.image or target.sidecar_image,
        "command": ["fleetwarden"],
        "args": [
            "sidecar",
            "--engine-url",
            f"http://127.0.0.1:{target.spec.model.engine.port}",
            "--listen",
            f"0.0.0.0:{sidecar.port}",
            "--config",
            f"{CONFIG_MOUNT}/{CONFIG_FILE_NAME}",
            "--region",
            target.pool.region,
            "--admin-token-file",
            f"{SECRET_MOUNT}/{ADMIN_TOKEN_KEY}",
            "--interaction-secret-file",
            f"{SECRET_MOUNT}/{INTERACTION_SECRET_KEY}",
            *_sidecar_bounds(sidecar),
        ],
        "ports": [{"name": "http", "containerPort": sidecar.port, "protocol": "TCP"}],
        "resources": _resources(sidecar.resources),
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": PROBE_PERIOD_S,
            "failureThreshold": 3,
        },
        "volumeMounts": [
            {"name": "fairness-config", "mountPath": CONFIG_MOUNT, "readOnly": True},
            {"name": "sidecar-secrets", "mountPath": SECRET_MOUNT, "readOnly": True},
        ],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SIDECAR_UID,
            "runAsGroup": SIDECAR_GID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            # The runtime's default syscall filter, as the "restricted" Pod Security Standard asks
            # of every container (the engine's context is left to what its image needs).
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def _pod_spec(target: RegionTarget) -> JsonDict:
    """The serving pod: engine + sidecar on the pool's nodes, spread over zones."""
    pool = target.pool
    spec: JsonDict = {
        "nodeSelector": dict(pool.node_selector),
        "tolerations": _tolerations(pool.tolerations),
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": pool.topology_key,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": target.selector},
            }
        ],
        "terminationGracePeriodSeconds": 60,
        # Neither vLLM nor the sidecar calls the Kubernetes API (the sidecar reads its config
        # and Secret from mounted volumes): a mounted token would only be a credential to steal.
        "automountServiceAccountToken": False,
        # Mounted volumes (the sidecar's Secret, mode 0440) are group-owned by fsGroup: without
        # it the sidecar could read its Secret only while the runtime gave it GID 0.
        # OnRootMismatch: the kubelet skips the recursive chown of a volume already owned right
        # (a model cache volume added by a mutating webhook can hold hundreds of GB).
        "securityContext": {"fsGroup": SIDECAR_GID, "fsGroupChangePolicy": "OnRootMismatch"},
        "containers": [_engine_container(target), _sidecar_container(target)],
        "volumes": [
            {"name": "fairness-config", "configMap": {"name": target.config_map}},
            {
                "name": "sidecar-secrets",
                "secret": {
                    "secretName": naming.secret_name(target.owner.name),
                    "defaultMode": 0o440,
                },
            },
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ],
    }
    # Only when the user set the field, so that this field alone never changes (and rolls) the
    # pod template of existing Deployments; `[]` is passed through and removes earlier secrets.
    pull_secrets = target.spec.image_pull_secrets
    if pull_secrets is not None:
        spec["imagePullSecrets"] = [secret.to_k8s() for secret in pull_secrets]
    return spec


def build_deployment(target: RegionTarget) -> JsonDict:
    """The serving Deployment: engine + sidecar, placed on the pool's nodes, spread over zones."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(target, target.name),
        "spec": {
            "replicas": target.replicas,
            "selector": {"matchLabels": target.selector},
            # GPU pools are full by design: replace pods one at a time instead of surging.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "template": {
                "metadata": {
                    "labels": target.labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(target.spec.sidecar.port),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": _pod_spec(target),
            },
        },
    }


def build_service(target: RegionTarget) -> JsonDict:
    """The region's endpoint: clients call the sidecar; `metrics` is for the ServiceMonitor."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(target, target.name),
        "spec": {
            "type": "ClusterIP",
            "selector": target.selector,
            "ports": [
                {"name": "http", "port": SERVICE_PORT, "targetPort": "http", "protocol": "TCP"},
                {
                    "name": "metrics",
                    "port": target.spec.sidecar.port,
                    "targetPort": "http",
                    "protocol": "TCP",
                },
            ],
        },
    }


def build_config_map(target: RegionTarget) -> JsonDict:
    """The sidecar's fairness config; the source of truth a restarted sidecar loads."""
    metadata = _metadata(target, target.config_map)
    metadata["annotations"] = {naming.CONFIG_VERSION_ANNOTATION: target.config_version}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {CONFIG_FILE_NAME: target.config_document},
    }


def plain_selector(deployment: JsonDict) -> dict[str, str] | None:
    """A Deployment's selector when it is plain `matchLabels`, the only form the operator
    writes; None otherwise (a Deployment someone else made)."""
    selector = (deployment.get("spec") or {}).get("selector") or {}
    labels = selector.get("matchLabels")
    if set(selector) != {"matchLabels"} or not isinstance(labels, dict) or not labels:
        return None
    if not all(isinstance(value, str) for value in labels.values()):
        return None
    return dict(labels)


def keep_selector(desired: JsonDict, live: JsonDict) -> JsonDict:
    """Deployment `desired` with the selector `live` was created with, its pods labelled to match.

    A Deployment's selector cannot change (the API server answers 422 Invalid), and an operator
    from before unique label values wrote selectors that names sharing their first 63
    characters share. Sending the new selector would fail on every reconcile and the region
    could no longer scale; so such a Deployment keeps its selector, its pod template keeps the
    labels its pods have (nothing restarts), and the reconciler reports it. A live selector that
    is not plain labels is not one the operator wrote: `desired` goes unchanged, and fails.
    """
    kept, wanted = plain_selector(live), plain_selector(desired)
    if kept is None or wanted is None or kept == wanted:
        return desired
    adjusted = copy.deepcopy(desired)
    spec = adjusted["spec"]
    spec["selector"] = {"matchLabels": dict(kept)}
    template = spec["template"]
    template["metadata"]["labels"] = {**template["metadata"]["labels"], **kept}
    for constraint in template["spec"].get("topologySpreadConstraints") or []:
        if constraint.get("labelSelector") == {"matchLabels": wanted}:
            constraint["labelSelector"] = {"matchLabels": dict(kept)}
    return adjusted


def with_selector(service: JsonDict, selector: dict[str, str]) -> JsonDict:
    """`service` selecting the pods of the Deployment it fronts, whatever that one selects."""
    adjusted = copy.deepcopy(service)
    adjusted["spec"]["selector"] = dict(selector)
    return adjusted


def kept_selector_message(name: str, kept: dict[str, str]) -> str:
    """What to tell about a Deployment that kept its selector (`keep_selector`), and what to do."""
    shown = ",".join(f"{key}={value}" for key, value in sorted(kept.items()))
    return (
        f"Deployment {name} keeps its selector {shown}: it predates unique selectors, and a "
        "Deployment's selector cannot change. A ModelDeployment whose name shares the first 63 "
        "characters of this one's would select the same pods; to migrate, delete the Deployment "
        f"(kubectl delete deployment {name}) and the operator recreates it with a unique "
        "selector (its pods restart)"
    )


def build_children(target: RegionTarget) -> list[JsonDict]:
    """All children of one region, in the order they should be created (config first)."""
    return [build_config_map(target), build_deployment(target), build_service(target)]
