"""Loading a fleet from custom-resource YAML, and engine profiles matching declared throughput."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetwarden.api.enums import PolicyName
from fleetwarden.sim.fleet_profiles import (
    DEFAULT_KV_BUDGET_TOKENS,
    derive_profile,
    saturated_tps,
    saturation_tps,
)
from fleetwarden.sim.fleet_spec import FleetSpecError, load_fleet
from tests.sim.fleet_fixtures import model_yaml, pool_yaml, write_fleet

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_loads_the_examples() -> None:
    fleet = load_fleet(EXAMPLES)
    assert sorted(fleet.pools) == ["eu-west-h100", "us-east-a100", "us-west-a100"]
    llama, mistral = fleet.model("llama-3-70b"), fleet.model("mistral-7b")
    assert llama.key == "llm-serving/llama-3-70b"
    assert llama.regions == ("us-east", "us-west", "eu-west")
    assert [p.throughput_tps for p in llama.placements] == [2200, 2200, 4100]
    assert llama.placements[0].cost_per_gpu_hour == 3.40
    assert llama.placements[2].model_load_s == 480
    assert llama.max_model_len == 16384
    assert llama.fairness.policy is PolicyName.VTC
    assert llama.fairness.source == "TenantPolicy llm-serving/enterprise"
    assert llama.fairness.tenants["acme"].weight == 3
    assert mistral.fairness.policy is PolicyName.WSC
    assert mistral.fairness.interaction_throttling
    assert any("Namespace" in line for line in fleet.skipped)


def test_without_a_selecting_policy_the_sidecar_default_applies(tmp_path: Path) -> None:
    fleet = write_fleet(tmp_path, pool_yaml(), model_yaml(policy="drr"))
    assert fleet.model("org/m").fairness.policy is PolicyName.DRR
    assert fleet.model("org/m").fairness.source == "default"


def test_the_oldest_selecting_policy_wins(tmp_path: Path) -> None:
    def policy(name: str, created: str, kind: str) -> str:
        return (
            "apiVersion: fleetwarden.dev/v1alpha1\nkind: TenantPolicy\n"
            f"metadata: {{name: {name}, namespace: ns, creationTimestamp: '{created}'}}\n"
            f"spec: {{policy: {kind}, selector: {{matchLabels: {{team: a}}}}}}\n"
        )

    fleet = write_fleet(
        tmp_path,
        pool_yaml(),
        model_yaml(labels="team: a"),
        policy("newer", "2025-02-01T00:00:00Z", "wsc"),
        policy("older", "2025-01-01T00:00:00Z", "drr"),
    )
    assert fleet.model("org/m").fairness.source == "TenantPolicy ns/older"


@pytest.mark.parametrize(
    "path", sorted((EXAMPLES / "invalid").glob("*.yaml")), ids=lambda p: p.stem
)
def test_invalid_examples_are_rejected_with_file_and_object(path: Path, tmp_path: Path) -> None:
    with pytest.raises(FleetSpecError) as failure:
        load_fleet([EXAMPLES / "10-regionpools.yaml", path])
    message = str(failure.value)
    assert message.startswith(f"{path} (document 1): ")
    assert "bad-" in message  # the object's name


@pytest.mark.parametrize(
    ("docs", "expected"),
    [
        ([pool_yaml(), model_yaml(regions=(("nowhere", 1, 1),))], "pool 'nowhere' is not defined"),
        ([pool_yaml(), pool_yaml()], "RegionPool pool-a defined twice"),
        ([pool_yaml()], "no ModelDeployment"),
        (
            [pool_yaml(), model_yaml().replace("A100-80GB: 2000.0", "H100-80GB: 2000.0")],
            "no throughput for GPU type 'A100-80GB'",
        ),
        (
            [pool_yaml(), model_yaml(regions=(("pool-a", 3, 1),))],
            "ModelDeployment ns/m: spec.regions.0",
        ),
        (
            [
                pool_yaml(),
                "apiVersion: fleetwarden.dev/v1alpha1\nkind: Fleet\nmetadata: {name: x}\n",
            ],
            "unknown fleetwarden kind 'Fleet'",
        ),
    ],
)
def test_bad_fleets_name_the_problem(tmp_path: Path, docs: list[str], expected: str) -> None:
    with pytest.raises(FleetSpecError, match=r"fleet\.yaml") as failure:
        write_fleet(tmp_path, *docs)
    assert expected in str(failure.value)


def test_yaml_syntax_errors_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("kind: [unclosed\n")
    with pytest.raises(FleetSpecError, match=r"broken\.yaml: not valid YAML"):
        load_fleet(tmp_path)
    with pytest.raises(FleetSpecError, match="no such file"):
        load_fleet(tmp_path / "missing.yaml")


def test_derived_profiles_serve_the_declared_throughput() -> None:
    fleet = load_fleet(EXAMPLES)
    for model in fleet.models.values():
        for placement in model.placements:
            profile = derive_profile(model, placement)
            assert profile.kv_budget_tokens == DEFAULT_KV_BUDGET_TOKENS
            assert saturated_tps(profile) == pytest.approx(placement.throughput_tps, rel=1e-9)
    llama = fleet.model("llama-3-70b")
    a100, h100 = (derive_profile(llama, p) for p in llama.placements[1:])
    # SageServe's reading: theta is served within SLA, at 70% of what saturates the instance
    relaxed = derive_profile(llama, llama.placements[0], theta_load=0.7)
    assert saturated_tps(relaxed) == pytest.approx(2200 / 0.7, rel=1e-9)
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="theta_load"):
            saturation_tps(llama.placements[0], bad)
    # same shape, faster GPU: every time shrinks by the throughput ratio
    assert a100.decode_base_s / h100.decode_base_s == pytest.approx(4100 / 2200)
