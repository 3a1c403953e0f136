"""`spec.sidecar.port` is the sidecar container's port: the CRD and the models refuse the ports
that would give an object the API server or the kubelet cannot run.

Port 80 is the Service's client port, and the Service exposes the sidecar's port too (as
`metrics`): a second port 80 makes the API server refuse the Service (duplicate port and
protocol). The engine's port is bound by the other container of the same pod.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from fleetwarden.api.crds import all_crds
from fleetwarden.api.v1alpha1 import ModelDeploymentSpec
from fleetwarden.api.v1alpha1.modeldeployment import SERVICE_PORT
from tests.support.crd_admission import AdmissionError, CrdAdmission, verdicts

ADMISSION = CrdAdmission(all_crds().values())


def _model_deployment(sidecar: dict[str, Any], engine: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "fleetwarden.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "x", "namespace": "n"},
        "spec": {
            "model": {"name": "m", "engine": engine},
            "throughput": {"A100-80GB": 1000},
            "regions": [{"pool": "p", "maxInstances": 4}],
            "sidecar": sidecar,
        },
    }


@pytest.mark.parametrize(
    ("sidecar", "engine", "accepted"),
    [
        ({}, {}, True),  # the defaults: 8080 and 8000
        ({"port": 81}, {"port": 80}, True),  # the engine's port is not on the Service
        ({"port": 8000}, {"port": 8080}, True),
        ({"port": 80}, {}, False),
        ({"port": 80}, {"port": 9000}, False),
        ({"port": 8000}, {}, False),  # the engine's default port
        ({}, {"port": 8080}, False),  # the sidecar's default port
        ({"port": 9000}, {"port": 9000}, False),
    ],
)
def test_crd_and_model_agree_on_sidecar_ports(
    sidecar: dict[str, Any], engine: dict[str, Any], accepted: bool
) -> None:
    assert verdicts(ADMISSION, ModelDeploymentSpec, _model_deployment(sidecar, engine)) == (
        accepted,
        accepted,
    )


def test_the_service_port_is_refused_with_the_reason() -> None:
    obj = _model_deployment({"port": SERVICE_PORT}, {})
    with pytest.raises(AdmissionError) as rejected:
        ADMISSION.admit(obj)
    assert any(f"port must not be {SERVICE_PORT}" in e for e in rejected.value.errors)
    with pytest.raises(ValidationError, match=f"port must not be {SERVICE_PORT}: the Service"):
        ModelDeploymentSpec.model_validate(obj["spec"])


def test_the_engine_port_is_refused_with_the_reason() -> None:
    obj = _model_deployment({"port": 9000}, {"port": 9000})
    reason = "sidecar.port must differ from model.engine.port"
    with pytest.raises(AdmissionError) as rejected:
        ADMISSION.admit(obj)
    assert any(reason in e for e in rejected.value.errors)
    with pytest.raises(ValidationError, match=reason):
        ModelDeploymentSpec.model_validate(obj["spec"])
