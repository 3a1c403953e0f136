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


LABEL_HEAD = MAX_NAME - 9
"""Characters of a label value kept before `-<8 hex>` when the text does not fit as it is."""


def _cleaned(text: str) -> str:
    """`text` with every character a label value may not hold replaced by `-`."""
    return "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "-" for c in text)


def legacy_label_value(text: str) -> str:
    """The value fleetwarden before unique label values gave `text`: cleaned and cut to 63
    characters, no hash. Names sharing their first 63 characters got the same value; it is kept
    only to find the pods and children that an earlier operator labelled so."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in text)[:MAX_NAME]
    return cleaned.strip("._-")


def label_value(text: str) -> str:
    """A label value naming `text` alone: `text` itself when it is a valid label value, else
    its first characters and a stable hash of the whole (like `child_name`).

    Two ModelDeployments or pools whose names share their first 63 characters must not share
    a value: the value is in the serving Deployments' and Services' selectors, so a shared one
    lets a Service send one model's traffic to another model's pods. A text that fits is kept
    byte for byte, because existing Deployments' selectors hold it and cannot change.
    """
    cleaned = _cleaned(text)
    if cleaned == text and len(text) <= MAX_NAME and text == text.strip("._-"):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    head = cleaned[:LABEL_HEAD].strip("._-")
    return f"{head}-{digest}" if head else digest


def descriptive_label_value(text: str) -> str:
    """A label value that only describes (region, GPU type), so it need not be unique: cleaned
    and cut to 63 characters as before unique label values, so that no pod template changes
    (and no pod restarts) because of them."""
    return _cleaned(text)[:MAX_NAME].strip("._-")


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
        REGION_LABEL: descriptive_label_value(region),
        GPU_TYPE_LABEL: descriptive_label_value(gpu_type),
    }


def model_deployment_label_values(model_deployment: str) -> list[str]:
    """The values a child or pod of `model_deployment` may carry: the current one, and the one
    an earlier operator gave it when that differs (its Deployments keep their selectors)."""
    current, legacy = label_value(model_deployment), legacy_label_value(model_deployment)
    return [current] if legacy in (current, "") else [current, legacy]


def children_selector(model_deployment: str) -> str:
    """Label selector (text form) that lists every child of one ModelDeployment, with those an
    earlier operator labelled by a value that another name may share: whoever acts on what it
    lists must check ownership (the owner reference's uid, or the pod's ReplicaSet)."""
    values = model_deployment_label_values(model_deployment)
    if len(values) == 1:
        return f"{MANAGED_BY}={MANAGER},{MODEL_DEPLOYMENT_LABEL}={values[0]}"
    return f"{MANAGED_BY}={MANAGER},{MODEL_DEPLOYMENT_LABEL} in ({','.join(values)})"
