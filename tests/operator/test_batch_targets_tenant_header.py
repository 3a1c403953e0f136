"""`fleetwarden batch-targets` gives each target the tenant header its sidecars trust.

A region's sidecars read the tenant from `spec.sidecar.tenantHeader` only; a target rendered
without it made the batch service send `x-fleetwarden-tenant`, and every batch item of a
ModelDeployment with another header ran as tenant `default`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec, RegionPoolSpec
from fleetwarden.batch.config import TargetConfig
from fleetwarden.batch.policy import TENANT_HEADER, tenant_header_problem
from fleetwarden.cli import main
from fleetwarden.operator.batch_targets import render_batch_targets
from tests.operator.fixtures import example_objects

PROMETHEUS = "http://prometheus.monitoring:9090"
LLAMA = "llm-serving/llama-3-70b"
MISTRAL = "llm-serving/mistral-7b"


def _objects(headers: dict[str, str]) -> list[dict[str, Any]]:
    """examples/ with `spec.sidecar.tenantHeader` set on the ModelDeployments named in
    `headers` (`namespace/name` -> header)."""
    objects = example_objects()
    for obj in objects:
        key = f"{obj['metadata'].get('namespace')}/{obj['metadata']['name']}"
        if obj["kind"] == "ModelDeployment" and key in headers:
            obj["spec"].setdefault("sidecar", {})["tenantHeader"] = headers[key]
    return objects


def _fleet(
    headers: dict[str, str],
) -> tuple[dict[str, RegionPoolSpec], dict[str, ModelDeploymentSpec]]:
    pools, models = {}, {}
    for obj in _objects(headers):
        if obj["kind"] == "RegionPool":
            pools[obj["metadata"]["name"]] = RegionPoolSpec.model_validate(obj["spec"])
        elif obj["kind"] == "ModelDeployment":
            key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
            models[key] = ModelDeploymentSpec.model_validate(obj["spec"])
    return pools, models


def _headers(targets: list[dict[str, Any]]) -> dict[tuple[str, str, str], str]:
    return {(t["model"], t["region"], t["kind"]): t["tenant_header"] for t in targets}


def test_every_target_carries_its_model_deployments_tenant_header() -> None:
    pools, models = _fleet({LLAMA: "X-Tenant-ID"})
    rendered = render_batch_targets(
        pools, models, prometheus_url=PROMETHEUS, header_problem=tenant_header_problem
    )
    assert rendered.skipped == []
    headers = _headers(rendered.targets)
    llama = {slot: h for slot, h in headers.items() if slot[0] == "llama-3-70b"}
    assert {kind for _, _, kind in llama} == {"shared", "spot"}  # spot pods run sidecars too
    assert set(llama.values()) == {"x-tenant-id"}
    mistral = [h for slot, h in headers.items() if slot[0] == "mistral-7b"]
    assert mistral
    assert set(mistral) == {TENANT_HEADER}  # the CRD's default, which the sidecar trusts then
    for target in rendered.targets:
        assert TargetConfig.model_validate(target).tenant_header == target["tenant_header"]


@pytest.mark.parametrize("bad", ["Authorization", "x-fleetwarden-tier", "X-Fleetwarden-Batch-Item"])
def test_a_header_the_batch_service_cannot_send_skips_that_model_deployment(bad: str) -> None:
    """The CRD takes any HTTP field name (a name that is none, such as `x tenant`, is refused
    there); one the batch service already sends for itself is reported, not rendered into a
    target the batch config would refuse (or one that loses the tenant again)."""
    pools, models = _fleet({MISTRAL: bad})
    rendered = render_batch_targets(
        pools, models, prometheus_url=PROMETHEUS, header_problem=tenant_header_problem
    )
    assert {t["model"] for t in rendered.targets} == {"llama-3-70b"}
    assert len(rendered.skipped) == 1
    assert rendered.skipped[0].startswith(f"{MISTRAL}: spec.sidecar.tenantHeader")


def test_the_command_prints_each_tenant_header(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump_all(_objects({LLAMA: "x-tenant-id"})))
    assert main(["batch-targets", "--fleet", str(fleet), "--prometheus", PROMETHEUS]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err
    targets = [TargetConfig.model_validate(t) for t in yaml.safe_load(captured.out)["targets"]]
    assert {(t.model, t.tenant_header) for t in targets} == {
        ("llama-3-70b", "x-tenant-id"),
        ("mistral-7b", TENANT_HEADER),
    }


def test_the_command_warns_about_a_header_it_cannot_send(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump_all(_objects({LLAMA: "Authorization"})))
    assert main(["batch-targets", "--fleet", str(fleet), "--prometheus", PROMETHEUS]) == 0
    captured = capsys.readouterr()
    assert f"warning: {LLAMA}: spec.sidecar.tenantHeader" in captured.err
    assert "does not fit the batch config schema" not in captured.err
    targets = yaml.safe_load(captured.out)["targets"]
    assert {t["model"] for t in targets} == {"mistral-7b"}
