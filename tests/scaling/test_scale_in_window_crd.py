"""`spec.scaling.scaleInStabilizationSeconds` in the generated CRDs and the pydantic model.

The committed CRD files (both copies) are admitted as the API server would (schema defaults,
OpenAPI validation, CEL rules; `tests.support.crd_admission`), and the model must give the same
verdict on every value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec
from fleetwarden.cli import DEFAULT_CRD_DIRS
from tests.support.crd_admission import CrdAdmission, load_crds, verdicts

ROOT = Path(__file__).resolve().parents[2]
ADMISSIONS = {str(d): CrdAdmission(load_crds(ROOT / d)) for d in DEFAULT_CRD_DIRS}


def _model_deployment(scaling: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "fleetwarden.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "x", "namespace": "n"},
        "spec": {
            "model": {"name": "m"},
            "throughput": {"A100-80GB": 1000},
            "regions": [{"pool": "p", "maxInstances": 4}],
            "scaling": scaling,
        },
    }


@pytest.mark.parametrize("crds", list(ADMISSIONS), ids=str)
@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        (-1, False),
        (-3600, False),
        (0, True),
        (1, True),
        (600, True),
        (3600, True),
        (3601, False),
        (1.5, False),
    ],
)
def test_crd_and_model_agree_on_the_window(crds: str, value: object, accepted: bool) -> None:
    obj = _model_deployment({"scaleInStabilizationSeconds": value})
    crd_ok, model_ok = verdicts(ADMISSIONS[crds], ModelDeploymentSpec, obj)
    assert crd_ok == model_ok == accepted


@pytest.mark.parametrize("crds", list(ADMISSIONS), ids=str)
def test_the_window_defaults_to_zero(crds: str) -> None:
    stored = ADMISSIONS[crds].admit(_model_deployment({}))
    assert stored["spec"]["scaling"]["scaleInStabilizationSeconds"] == 0
    spec = ModelDeploymentSpec.model_validate(stored["spec"])
    assert spec.scaling.scale_in_stabilization_seconds == 0
    assert spec.scaling.to_k8s()["scaleInStabilizationSeconds"] == 0


def test_the_crd_describes_the_field() -> None:
    text = (ROOT / "docs" / "crd-reference.md").read_text()
    row = next(line for line in text.splitlines() if "scaleInStabilizationSeconds" in line)
    assert ">= 0; <= 3600; default `0`" in row
