"""The one module that talks to the Kubernetes API (through `kubernetes.aio`).

Objects travel as plain dicts, the way the API server sends them, so builders and comparisons need
no model classes. API failures are translated once, here, into `KubeApiError` subclasses:

    KubeApiError            any non-2xx answer, with the server's reason and message
    ├── NotFoundError       404
    ├── ConflictError       409 (already exists, or a stale resourceVersion)
    └── InvalidError        422 (the server rejected the object)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kubernetes.aio import client as k8s_client
from kubernetes.aio import config as k8s_config

from fleetwarden.api.v1alpha1 import GROUP, VERSION

JsonDict = dict[str, Any]
REQUEST_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ResourceKind:
    """Where a kind lives in the REST API."""

    group: str
    version: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            root += f"/namespaces/{quote(namespace, safe='')}"
        root += f"/{self.plural}"
        if name is not None:
            root += f"/{quote(name, safe='')}"
        if subresource is not None:
            root += f"/{subresource}"
        return root


DEPLOYMENTS = ResourceKind("apps", "v1", "deployments", namespaced=True)
SERVICES = ResourceKind("", "v1", "services", namespaced=True)
CONFIG_MAPS = ResourceKind("", "v1", "configmaps", namespaced=True)
SECRETS = ResourceKind("", "v1", "secrets", namespaced=True)
PODS = ResourceKind("", "v1", "pods", namespaced=True)
REGION_POOLS = ResourceKind(GROUP, VERSION, "regionpools", namespaced=False)
MODEL_DEPLOYMENTS = ResourceKind(GROUP, VERSION, "modeldeployments", namespaced=True)
TENANT_POLICIES = ResourceKind(GROUP, VERSION, "tenantpolicies", namespaced=True)
NAMESPACES = ResourceKind("", "v1", "namespaces", namespaced=False)
CLUSTER_PEERINGS = ResourceKind("kopf.dev", "v1", "clusterkopfpeerings", namespaced=False)
NAMESPACED_PEERINGS = ResourceKind("kopf.dev", "v1", "kopfpeerings", namespaced=True)

_BY_KIND = {
    ("apps/v1", "Deployment"): DEPLOYMENTS,
    ("v1", "Service"): SERVICES,
    ("v1", "ConfigMap"): CONFIG_MAPS,
    ("v1", "Secret"): SECRETS,
    ("v1", "Pod"): PODS,
    ("v1", "Namespace"): NAMESPACES,
    (f"{GROUP}/{VERSION}", "RegionPool"): REGION_POOLS,
    (f"{GROUP}/{VERSION}", "ModelDeployment"): MODEL_DEPLOYMENTS,
    (f"{GROUP}/{VERSION}", "TenantPolicy"): TENANT_POLICIES,
    ("kopf.dev/v1", "ClusterKopfPeering"): CLUSTER_PEERINGS,
    ("kopf.dev/v1", "KopfPeering"): NAMESPACED_PEERINGS,
}


def kind_of(obj: JsonDict) -> ResourceKind:
    """The REST location of an object the operator knows, from its apiVersion and kind."""
    try:
        return _BY_KIND[(obj["apiVersion"], obj["kind"])]
    except KeyError:
        raise ValueError(
            f"fleetwarden does not handle {obj.get('apiVersion')} {obj.get('kind')}"
        ) from None


class KubeApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFoundError(KubeApiError):
    pass


class ConflictError(KubeApiError):
    pass


class InvalidError(KubeApiError):
    pass


def _error(status: int, payload: bytes) -> KubeApiError:
    try:
        body = json.loads(payload)
        reason, message = str(body.get("reason", "")), str(body.get("message", ""))
    except ValueError:
        reason, message = "", payload.decode(errors="replace")[:500]
    cls = {404: NotFoundError, 409: ConflictError, 422: InvalidError}.get(status, KubeApiError)
    return cls(status, reason or "Unknown", message)


def kubeconfig_path() -> str | None:
    """$KUBECONFIG (its first entry) or ~/.kube/config, when that file exists.

    Read at call time: the client library reads $KUBECONFIG once at import, which would tie the
    operator to whatever the environment held when Python started.
    """
    path = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    first = path.split(os.pathsep)[0]
    return first if Path(first).exists() else None


async def load_configuration() -> k8s_client.Configuration:
    """Kubeconfig when there is one, else the in-cluster service account."""
    configuration = k8s_client.Configuration()
    path = kubeconfig_path()
    if path is not None:
        await k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, client_configuration=configuration
        )
    else:
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return configuration


class KubeClient:
    """Typed-error, dict-in dict-out access to the resources the operator manages."""

    def __init__(self, api: k8s_client.ApiClient) -> None:
        self._api = api

    @classmethod
    async def connect(cls) -> KubeClient:
        return cls(k8s_client.ApiClient(await load_configuration()))

    async def close(self) -> None:
        await self._api.close()  # type: ignore[no-untyped-call]

    async def _request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> JsonDict:
        _, url, headers, payload, _ = await self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = await self._api.call_api(
            method, url, header_params=headers, body=payload, _request_timeout=REQUEST_TIMEOUT_S
        )
        data = await response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status < 300:
            raise _error(response.status, data)
        result: JsonDict = json.loads(data) if data else {}
        return result

    async def get(
        self, kind: ResourceKind, name: str, namespace: str | None = None
    ) -> JsonDict | None:
        """The object, or None when it does not exist."""
        try:
            return await self._request("GET", kind.path(namespace, name))
        except NotFoundError:
            return None

    async def list(
        self, kind: ResourceKind, namespace: str | None = None, label_selector: str | None = None
    ) -> list[JsonDict]:
        query = {"labelSelector": label_selector} if label_selector else None
        body = await self._request("GET", kind.path(namespace), query=query)
        items: list[JsonDict] = body.get("items", [])
        return items

    async def create(self, body: JsonDict) -> JsonDict:
        kind = kind_of(body)
        namespace = body["metadata"].get("namespace")
        return await self._request("POST", kind.path(namespace), body=body)

    async def merge_patch(
        self,
        kind: ResourceKind,
        name: str,
        patch: JsonDict,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> JsonDict:
        """RFC 7386 merge patch: maps merge, lists and scalars are replaced."""
        return await self._request(
            "PATCH",
            kind.path(namespace, name, subresource),
            body=patch,
            content_type="application/merge-patch+json",
        )

    async def patch_status(
        self, kind: ResourceKind, name: str, status: JsonDict, namespace: str | None = None
    ) -> JsonDict:
        return await self.merge_patch(kind, name, {"status": status}, namespace, "status")

    async def delete(self, kind: ResourceKind, name: str, namespace: str | None = None) -> bool:
        """Delete with background propagation; False when it was already gone."""
        try:
            await self._request(
                "DELETE",
                kind.path(namespace, name),
                body={
                    "kind": "DeleteOptions",
                    "apiVersion": "v1",
                    "propagationPolicy": "Background",
                },
            )
        except NotFoundError:
            return False
        return True
