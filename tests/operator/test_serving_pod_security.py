"""The sidecar reads its Secret volume through its own group, not by grace of GID 0.

The Secret is mounted with mode 0440 (owner and group may read). A container given only
`runAsUser` gets the image's or the runtime's primary group, GID 0 on common runtimes: the files
(root:root) were readable only through that accident. The pod's `fsGroup` makes the kubelet give
the volume's files that group, and the sidecar runs with it, as the chart's batch service does.
"""

from __future__ import annotations

import re
from pathlib import Path

from fleetwarden.operator import builders
from fleetwarden.operator.spot_deployments import build_spot_deployment
from tests.operator.fixtures import region_target

ROOT = Path(__file__).resolve().parents[2]
NONROOT = 65532


def _pod(deployment: dict[str, object]) -> dict[str, object]:
    spec = deployment["spec"]
    assert isinstance(spec, dict)
    pod = spec["template"]["spec"]
    assert isinstance(pod, dict)
    return pod


def test_serving_pods_give_the_secret_volume_the_sidecars_group() -> None:
    target = region_target()
    for deployment in (builders.build_deployment(target), build_spot_deployment(target, 1)):
        pod = _pod(deployment)
        assert pod["securityContext"] == {
            "fsGroup": NONROOT,
            "fsGroupChangePolicy": "OnRootMismatch",
        }
        sidecar = next(c for c in pod["containers"] if c["name"] == "sidecar")
        context = sidecar["securityContext"]
        assert context["runAsUser"] == NONROOT
        assert context["runAsGroup"] == pod["securityContext"]["fsGroup"]
        secrets = next(v for v in pod["volumes"] if v["name"] == "sidecar-secrets")
        assert secrets["secret"]["defaultMode"] & 0o040  # what the group is there to read
        assert secrets["secret"]["defaultMode"] & 0o007 == 0  # and nobody else


def test_serving_pods_use_the_ids_of_the_charts_batch_service() -> None:
    """One image, one set of ids: the batch service's template already sets both."""
    template = (ROOT / "helm" / "fleetwarden" / "templates" / "batch.yaml").read_text()
    assert re.search(rf"^\s+fsGroup: {NONROOT}$", template, re.MULTILINE)
    assert re.search(rf"^\s+runAsGroup: {NONROOT}$", template, re.MULTILINE)
    assert builders.SIDECAR_UID == builders.SIDECAR_GID == NONROOT
