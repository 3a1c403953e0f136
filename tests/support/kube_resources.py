"""What the emulated cluster serves: built-in kinds, CRD-defined kinds, and discovery.

Kopf and client-go (inside Helm) learn everything about resources from the
discovery endpoints (``/api``, ``/apis``, ``/apis/{group}/{version}``): whether a
kind is namespaced, whether it has a ``status`` subresource (Kopf then patches
``/status`` separately), the kind names. If discovery were sloppy, Kopf would
e.g. never start watching (it waits until ``v1/namespaces`` is discoverable)
or patch status into the main endpoint where the server drops it.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclasses.dataclass
class ResourceType:
    """One servable ``group/version/plural`` with everything the server needs to know about it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()  # e.g. ("status", "scale")
    verbs: tuple[str, ...] = tuple(ALL_VERBS)
    list_kind: str = ""
    custom: bool = False  # defined by a CRD (merge-patch only; unstructured list items)
    schema: dict[str, Any] | None = None  # CRD openAPIV3Schema, for pruning/validation
    storage_key: tuple[str, str] = ("", "")  # (group, plural): all versions share storage
    returns_deleted_object: bool = False  # DELETE answers the object rather than a Status
    virtual: bool = False  # create-only review kinds: answered, never stored

    def __post_init__(self) -> None:
        self.singular = self.singular or self.kind.lower()
        self.list_kind = self.list_kind or f"{self.kind}List"
        self.storage_key = (self.group, self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> str:
        return self.api_version

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def discovery_entries(self) -> list[dict[str, Any]]:
        """The ``APIResource`` entries for this resource and its subresources."""
        entry: dict[str, Any] = {
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(self.verbs),
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        if self.categories:
            entry["categories"] = list(self.categories)
        entries = [entry]
        for sub in self.subresources:
            sub_kind = "Scale" if sub == "scale" else self.kind
            sub_entry: dict[str, Any] = {
                "name": f"{self.plural}/{sub}",
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": sub_kind,
                "verbs": ["get", "patch", "update"],
            }
            if sub == "scale":
                sub_entry["group"] = "autoscaling"
                sub_entry["version"] = "v1"
            entries.append(sub_entry)
        return entries


def _rt(
    gv: str,
    plural: str,
    kind: str,
    namespaced: bool = True,
    *,
    short: tuple[str, ...] = (),
    sub: tuple[str, ...] = (),
    cats: tuple[str, ...] = (),
    verbs: tuple[str, ...] = tuple(ALL_VERBS),
    returns_deleted: bool = False,
    virtual: bool = False,
) -> ResourceType:
    group, _, version = gv.rpartition("/")
    return ResourceType(
        group=group,
        version=version,
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        short_names=short,
        subresources=sub,
        categories=cats,
        verbs=verbs,
        returns_deleted_object=returns_deleted,
        virtual=virtual,
    )


def builtin_resources() -> list[ResourceType]:
    """Built-in kinds an operator or Helm chart plausibly touches (monitoring.coreos.com is absent)."""
    return [
        _rt(
            "v1",
            "namespaces",
            "Namespace",
            False,
            short=("ns",),
            sub=("status",),
            verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
            returns_deleted=True,
        ),
        _rt("v1", "configmaps", "ConfigMap", short=("cm",)),
        _rt("v1", "secrets", "Secret"),
        _rt("v1", "services", "Service", short=("svc",), sub=("status",), cats=("all",)),
        _rt("v1", "serviceaccounts", "ServiceAccount", short=("sa",)),
        _rt("v1", "events", "Event", short=("ev",)),
        _rt(
            "v1", "pods", "Pod", short=("po",), sub=("status",), cats=("all",), returns_deleted=True
        ),
        _rt("v1", "endpoints", "Endpoints", short=("ep",)),
        _rt(
            "v1", "persistentvolumeclaims", "PersistentVolumeClaim", short=("pvc",), sub=("status",)
        ),
        _rt("v1", "persistentvolumes", "PersistentVolume", False, short=("pv",), sub=("status",)),
        _rt("v1", "nodes", "Node", False, short=("no",), sub=("status",)),
        _rt("v1", "resourcequotas", "ResourceQuota", short=("quota",), sub=("status",)),
        _rt("v1", "limitranges", "LimitRange", short=("limits",)),
        _rt(
            "apps/v1",
            "deployments",
            "Deployment",
            short=("deploy",),
            sub=("status", "scale"),
            cats=("all",),
        ),
        _rt(
            "apps/v1",
            "statefulsets",
            "StatefulSet",
            short=("sts",),
            sub=("status", "scale"),
            cats=("all",),
        ),
        _rt("apps/v1", "daemonsets", "DaemonSet", short=("ds",), sub=("status",), cats=("all",)),
        _rt(
            "apps/v1",
            "replicasets",
            "ReplicaSet",
            short=("rs",),
            sub=("status", "scale"),
            cats=("all",),
        ),
        _rt("apps/v1", "controllerrevisions", "ControllerRevision"),
        _rt("batch/v1", "jobs", "Job", sub=("status",), cats=("all",)),
        _rt("batch/v1", "cronjobs", "CronJob", short=("cj",), sub=("status",), cats=("all",)),
        _rt(
            "autoscaling/v2",
            "horizontalpodautoscalers",
            "HorizontalPodAutoscaler",
            short=("hpa",),
            sub=("status",),
            cats=("all",),
        ),
        _rt(
            "policy/v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            short=("pdb",),
            sub=("status",),
        ),
        _rt("networking.k8s.io/v1", "ingresses", "Ingress", short=("ing",), sub=("status",)),
        _rt("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", short=("netpol",)),
        _rt("networking.k8s.io/v1", "ingressclasses", "IngressClass", False),
        _rt("discovery.k8s.io/v1", "endpointslices", "EndpointSlice"),
        _rt("rbac.authorization.k8s.io/v1", "roles", "Role"),
        _rt("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding"),
        _rt("rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", False),
        _rt("rbac.authorization.k8s.io/v1", "clusterrolebindings", "ClusterRoleBinding", False),
        _rt(
            "apiextensions.k8s.io/v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            False,
            short=("crd", "crds"),
            sub=("status",),
            cats=("api-extensions",),
        ),
        _rt(
            "admissionregistration.k8s.io/v1",
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
            False,
            cats=("api-extensions",),
        ),
        _rt(
            "admissionregistration.k8s.io/v1",
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
            False,
            cats=("api-extensions",),
        ),
        _rt("events.k8s.io/v1", "events", "Event", short=("ev",)),
        _rt("coordination.k8s.io/v1", "leases", "Lease"),
        _rt("scheduling.k8s.io/v1", "priorityclasses", "PriorityClass", False, short=("pc",)),
        _rt("storage.k8s.io/v1", "storageclasses", "StorageClass", False, short=("sc",)),
        _rt(
            "authorization.k8s.io/v1",
            "selfsubjectaccessreviews",
            "SelfSubjectAccessReview",
            False,
            verbs=("create",),
            virtual=True,
        ),
        _rt(
            "authorization.k8s.io/v1",
            "subjectaccessreviews",
            "SubjectAccessReview",
            False,
            verbs=("create",),
            virtual=True,
        ),
    ]


def resources_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """One :class:`ResourceType` per served version of a CustomResourceDefinition."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    result = []
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        subresources = tuple(sorted((version.get("subresources") or {}).keys()))
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        result.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                singular=names.get("singular") or names["kind"].lower(),
                list_kind=names.get("listKind") or f"{names['kind']}List",
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                subresources=subresources,
                custom=True,
                schema=copy.deepcopy(schema) if schema else None,
                returns_deleted_object=True,
            )
        )
    return result


_VERSION_RE = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Kube-aware version ordering: GA > beta > alpha, higher numbers first; others last."""
    match = _VERSION_RE.match(version)
    if not match:
        return (3, 0, 0, version)
    major, stage, minor = match.groups()
    stage_rank = {None: 0, "beta": 1, "alpha": 2}[stage]
    return (stage_rank, -int(major), -int(minor or 0), version)


def group_discovery(group: str, versions: list[str]) -> dict[str, Any]:
    ordered = sorted(versions, key=version_priority)
    return {
        "name": group,
        "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in ordered],
        "preferredVersion": {"groupVersion": f"{group}/{ordered[0]}", "version": ordered[0]},
    }


def crd_status(crd: dict[str, Any], now: str) -> dict[str, Any]:
    """The status the apiextensions controllers write once a CRD's names are accepted."""
    names = copy.deepcopy((crd.get("spec") or {}).get("names") or {})
    names.setdefault("singular", names.get("kind", "").lower())
    names.setdefault("listKind", f"{names.get('kind', '')}List")
    storage = [v["name"] for v in crd["spec"].get("versions", []) if v.get("storage")]
    return {
        "acceptedNames": names,
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
                "lastTransitionTime": now,
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
                "lastTransitionTime": now,
            },
        ],
        "storedVersions": storage,
    }


def crd_manifest(
    group: str,
    kind: str,
    plural: str | None = None,
    *,
    versions: tuple[str, ...] = ("v1",),
    scope: str = "Namespaced",
    short_names: tuple[str, ...] = (),
    status_subresource: bool = True,
    schema: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A CustomResourceDefinition manifest for tests; the first version is the storage one.

    The default schema preserves unknown fields in ``spec`` and ``status``, as
    an operator's CRD must for Kopf to keep its ``status.kopf`` bookkeeping.
    """
    plural = plural or f"{kind.lower()}s"
    schema = schema or {
        "type": "object",
        "properties": {
            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": scope,
            "names": {
                "plural": plural,
                "singular": kind.lower(),
                "kind": kind,
                "listKind": f"{kind}List",
                "shortNames": list(short_names),
            },
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": index == 0,
                    "subresources": {"status": {}} if status_subresource else {},
                    "schema": {"openAPIV3Schema": copy.deepcopy(schema)},
                }
                for index, version in enumerate(versions)
            ],
        },
    }
