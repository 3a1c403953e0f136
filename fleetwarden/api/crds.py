"""The CustomResourceDefinitions, generated from the pydantic models.

`crds/*.yaml` and the chart's `files/crds/*.yaml` are written from `all_crds()` by `fleetwarden crds`;
a test regenerates them and fails when the files are stale. The Kopf peering CRDs are included so
that `kubectl apply -f crds/` gives leader election (Kopf peering) everything it needs.

There is no `scale` subresource on ModelDeployment: it carries one replica count per region, and a
single `replicas` number cannot say which region to grow; the planner owns per-region replicas.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from fleetwarden.api.structural import structural_schema
from fleetwarden.api.v1alpha1 import (
    GROUP,
    VERSION,
    ModelDeploymentSpec,
    ModelDeploymentStatus,
    RegionPoolSpec,
    RegionPoolStatus,
    TenantPolicySpec,
    TenantPolicyStatus,
)

JsonDict = dict[str, Any]
CATEGORIES = ["fleetwarden"]


@dataclass(frozen=True)
class Column:
    """One `kubectl get` column."""

    name: str
    type: str
    json_path: str
    description: str
    priority: int = 0

    def to_k8s(self) -> JsonDict:
        column: JsonDict = {
            "name": self.name,
            "type": self.type,
            "jsonPath": self.json_path,
            "description": self.description,
        }
        if self.priority:
            column["priority"] = self.priority
        return column


@dataclass(frozen=True)
class KindInfo:
    """Everything the API server must know about one kind besides its schema."""

    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    namespaced: bool
    spec: type[BaseModel]
    status: type[BaseModel]
    description: str
    columns: tuple[Column, ...] = field(default=())

    @property
    def name(self) -> str:
        """The CRD's metadata.name: `<plural>.<group>`."""
        return f"{self.plural}.{GROUP}"


_READY = Column(
    "Ready", "string", '.status.conditions[?(@.type=="Ready")].status', "Whether all is in order."
)
_AGE = Column("Age", "date", ".metadata.creationTimestamp", "Time since creation.")

REGION_POOL = KindInfo(
    kind="RegionPool",
    plural="regionpools",
    singular="regionpool",
    short_names=("rp",),
    namespaced=False,
    spec=RegionPoolSpec,
    status=RegionPoolStatus,
    description="A GPU node pool in one region: node selector, GPU type, capacity, cost, spot.",
    columns=(
        Column("Region", "string", ".spec.region", "Region of the pool."),
        Column("GPU", "string", ".spec.gpuType", "GPU type of the nodes."),
        Column("GPUs", "integer", ".spec.capacity.gpus", "GPUs in the pool."),
        Column("Allocated", "integer", ".status.allocatedGpus", "GPUs allocated to models."),
        Column("Free", "integer", ".status.freeGpus", "GPUs still free."),
        Column("Instances", "integer", ".status.allocatedInstances", "Instances placed.", 1),
        _READY,
        _AGE,
    ),
)

MODEL_DEPLOYMENT = KindInfo(
    kind="ModelDeployment",
    plural="modeldeployments",
    singular="modeldeployment",
    short_names=("md",),
    namespaced=True,
    spec=ModelDeploymentSpec,
    status=ModelDeploymentStatus,
    description="One model served across several RegionPools, one serving Deployment per region.",
    columns=(
        Column("Model", "string", ".spec.model.name", "Model served.", 1),
        Column("Regions", "integer", ".status.regionCount", "Regions served."),
        Column("Instances", "integer", ".status.instances", "Replicas asked for."),
        Column("Target", "integer", ".status.targetInstances", "Replicas the plan wants."),
        Column("ReadyPods", "integer", ".status.readyInstances", "Ready serving pods."),
        _READY,
        _AGE,
    ),
)

TENANT_POLICY = KindInfo(
    kind="TenantPolicy",
    plural="tenantpolicies",
    singular="tenantpolicy",
    short_names=("tp",),
    namespaced=True,
    spec=TenantPolicySpec,
    status=TenantPolicyStatus,
    description="Fairness among tenants and applications inside every serving pod.",
    columns=(
        Column("Policy", "string", ".spec.policy", "Scheduler across tenants."),
        Column("Version", "string", ".status.configVersion", "Rendered config version."),
        Column("Acked", "integer", ".status.podsAcknowledged", "Sidecars on this version."),
        Column("Pods", "integer", ".status.podsTotal", "Ready sidecars."),
        _READY,
        _AGE,
    ),
)

KINDS: tuple[KindInfo, ...] = (REGION_POOL, MODEL_DEPLOYMENT, TENANT_POLICY)


def resource_schema(info: KindInfo) -> JsonDict:
    """The full openAPIV3Schema of one kind: apiVersion, kind, metadata, spec, status."""
    spec = structural_schema(info.spec)
    status = structural_schema(info.status)
    return {
        "type": "object",
        "description": info.description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def crd(info: KindInfo) -> JsonDict:
    """The CustomResourceDefinition of one fleetwarden kind."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": info.name,
            "labels": {
                "app.kubernetes.io/name": "fleetwarden",
                "app.kubernetes.io/part-of": "fleetwarden",
            },
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced" if info.namespaced else "Cluster",
            "names": {
                "kind": info.kind,
                "listKind": f"{info.kind}List",
                "plural": info.plural,
                "singular": info.singular,
                "shortNames": list(info.short_names),
                "categories": CATEGORIES,
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [c.to_k8s() for c in info.columns],
                    "schema": {"openAPIV3Schema": resource_schema(info)},
                }
            ],
        },
    }


def kopf_peering_crd(namespaced: bool) -> JsonDict:
    """Kopf's peering CRD (kopf.dev/v1), which its leader election stores heartbeats in."""
    kind = "KopfPeering" if namespaced else "ClusterKopfPeering"
    plural = kind.lower() + "s"
    open_object = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.kopf.dev",
            "labels": {
                "app.kubernetes.io/name": "fleetwarden",
                "app.kubernetes.io/part-of": "fleetwarden",
            },
        },
        "spec": {
            "group": "kopf.dev",
            "scope": "Namespaced" if namespaced else "Cluster",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": open_object, "status": open_object},
                        }
                    },
                }
            ],
        },
    }


def all_crds() -> dict[str, JsonDict]:
    """Every CRD fleetwarden needs, keyed by the file name it is written to."""
    files = {f"{info.plural}.yaml": crd(info) for info in KINDS}
    files["kopf-clusterkopfpeerings.yaml"] = kopf_peering_crd(namespaced=False)
    files["kopf-kopfpeerings.yaml"] = kopf_peering_crd(namespaced=True)
    return files
