"""Names and labels of the objects the operator creates.

Names are deterministic, so every reconcile finds the children it made before without storing
anything; labels let the operator list its children and let a ServiceMonitor find the sidecars.
"""

from __future__ import annotations

import hashlib

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "fleetwarden"
COMPONENT = "app.kubernetes.io/component"
SERVING = "serving"
PART_OF = "app.kubernetes.io/part-of"
MODEL_DEPLOYMENT_LABEL = "fleetwarden.dev/model-deployment"
POOL_LABEL = "fleetwarden.dev/pool"
REGION_LABEL = "fleetwarden.dev/region"
GPU_TYPE_LABEL = "fleetwarden.dev/gpu-type"
CONFIG_VERSION_ANNOTATION = "fleetwarden.dev/config-version"
FIELD_MANAGER = "fleetwarden-operator"

MAX_NAME = 63
"""Service names are DNS-1035 labels, so every child name is kept within 63 characters."""


def child_name(model_deployment: str, pool: str) -> str:
    """`<modeldeployment>-<pool>`, shortened with a stable hash suffix when it would be too long."""
    name = f"{model_deployment}-{pool}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9].rstrip('-')}-{digest}"


def config_map_name(model_deployment: str, pool: str) -> str:
    """The ConfigMap holding the sidecar's fairness config for one region."""
    base = child_name(model_deployment, pool)
    if len(base) + len("-fairness") <= MAX_NAME:
        return f"{base}-fairness"
    digest = hashlib.sha256(base.encode()).hexdigest()[:8]
    return f"{base[: MAX_NAME - 18].rstrip('-')}-{digest}-fairness"


def secret_name(model_deployment: str) -> str:
    """The Secret with the sidecars' admin token and interaction-token key (one per deployment,
    shared by every region so an interaction token is valid behind any of its pods)."""
    name = f"{model_deployment}-sidecar"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:235].rstrip('-')}-{digest}-sidecar"


def label_value(text: str) -> str:
    """A string made safe for a label value (<= 63 chars of [A-Za-z0-9._-], alphanumeric ends)."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in text)[:MAX_NAME]
    return cleaned.strip("._-")


def selector_labels(model_deployment: str, pool: str) -> dict[str, str]:
    """The Deployment's immutable selector: one model deployment in one pool."""
    return {MODEL_DEPLOYMENT_LABEL: label_value(model_deployment), POOL_LABEL: label_value(pool)}


def child_labels(model_deployment: str, pool: str, region: str, gpu_type: str) -> dict[str, str]:
    """Labels on every child object and serving pod."""
    return {
        MANAGED_BY: MANAGER,
        PART_OF: "fleetwarden",
        COMPONENT: SERVING,
        **selector_labels(model_deployment, pool),
        REGION_LABEL: label_value(region),
        GPU_TYPE_LABEL: label_value(gpu_type),
    }


def children_selector(model_deployment: str) -> str:
    """Label selector (text form) that lists every child of one ModelDeployment."""
    return f"{MANAGED_BY}={MANAGER},{MODEL_DEPLOYMENT_LABEL}={label_value(model_deployment)}"
