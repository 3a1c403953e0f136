"""`examples/` is accepted and `examples/invalid/` rejected, by the CRDs and by the models alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from fleetwarden.api.crds import all_crds
from fleetwarden.api.v1alpha1 import ModelDeployment, RegionPool, TenantPolicy
from tests.support.crd_admission import AdmissionError, CrdAdmission

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MODELS: dict[str, type[BaseModel]] = {
    "RegionPool": RegionPool,
    "ModelDeployment": ModelDeployment,
    "TenantPolicy": TenantPolicy,
}


def _valid_objects() -> list[dict[str, Any]]:
    objects = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return [o for o in objects if o["apiVersion"].startswith("fleetwarden.dev/")]


def _invalid_cases() -> list[tuple[str, str, dict[str, Any]]]:
    cases = []
    for path in sorted((EXAMPLES / "invalid").glob("*.yaml")):
        first = path.read_text().splitlines()[0]
        assert first.startswith("# expect: "), f"{path.name} must start with '# expect: ...'"
        cases.append(
            (path.name, first.removeprefix("# expect: "), yaml.safe_load(path.read_text()))
        )
    return cases


@pytest.fixture(scope="module")
def admission() -> CrdAdmission:
    return CrdAdmission(all_crds().values())


def test_examples_cover_what_the_issue_promises() -> None:
    objects = _valid_objects()
    pools = [o for o in objects if o["kind"] == "RegionPool"]
    assert len(pools) == 3
    assert len({p["spec"]["region"] for p in pools}) == 3
    assert len({p["spec"]["gpuType"] for p in pools}) == 2
    assert len([o for o in objects if o["kind"] == "ModelDeployment"]) == 2
    policies = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "TenantPolicy"}
    assert {p["policy"] for p in policies.values()} == {"vtc", "wsc"}
    assert any(any(a.get("stages") for a in p.get("applications", [])) for p in policies.values())
    assert len(_invalid_cases()) >= 12


@pytest.mark.parametrize(
    "obj", _valid_objects(), ids=lambda o: f"{o['kind']}/{o['metadata']['name']}"
)
def test_valid_example_is_admitted_and_parses(admission: CrdAdmission, obj: dict[str, Any]) -> None:
    stored = admission.admit(obj)
    model = MODELS[obj["kind"]].model_validate(stored)
    # The API server's defaults and the models' defaults say the same thing.
    assert MODELS[obj["kind"]].model_validate(obj) == model


@pytest.mark.parametrize(("name", "expect", "obj"), _invalid_cases(), ids=lambda v: str(v)[:40])
def test_invalid_example_is_rejected_for_its_reason(
    admission: CrdAdmission, name: str, expect: str, obj: dict[str, Any]
) -> None:
    with pytest.raises(AdmissionError) as rejected:
        admission.admit(obj)
    assert any(expect in error for error in rejected.value.errors), rejected.value.errors


@pytest.mark.parametrize(("name", "expect", "obj"), _invalid_cases(), ids=lambda v: str(v)[:40])
def test_invalid_example_is_rejected_by_the_models_too(
    name: str, expect: str, obj: dict[str, Any]
) -> None:
    """Objects made in Python (the simulator, tests) get the same verdict as `kubectl apply`."""
    with pytest.raises(ValidationError):
        MODELS[obj["kind"]].model_validate(obj)
