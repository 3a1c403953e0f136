"""`fleetwarden batch-targets`: the batch service's targets rendered from the fleet, each with
its ModelDeployment's release rule, in a form the batch service's own config accepts."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec, RegionPoolSpec
from fleetwarden.batch.config import BatchServiceConfig
from fleetwarden.cli import main
from fleetwarden.operator.batch_targets import render_batch_targets
from tests.operator.fixtures import EXAMPLES, example_objects

PROMETHEUS = "http://prometheus.monitoring:9090"


def _fleet() -> tuple[dict[str, RegionPoolSpec], dict[str, ModelDeploymentSpec]]:
    pools, models = {}, {}
    for obj in example_objects():
        if obj["kind"] == "RegionPool":
            pools[obj["metadata"]["name"]] = RegionPoolSpec.model_validate(obj["spec"])
        elif obj["kind"] == "ModelDeployment":
            key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
            models[key] = ModelDeploymentSpec.model_validate(obj["spec"])
    return pools, models


def test_every_region_gets_a_shared_target_and_spot_regions_a_spot_one() -> None:
    pools, models = _fleet()
    rendered = render_batch_targets(pools, models, prometheus_url=PROMETHEUS)
    assert rendered.skipped == []
    expected_shared = {
        (spec.served_name, pools[p.pool].region) for spec in models.values() for p in spec.regions
    }
    shared = {(t["model"], t["region"]) for t in rendered.targets if t["kind"] == "shared"}
    assert shared == expected_shared
    spot = [t for t in rendered.targets if t["kind"] == "spot"]
    assert [(t["model"], t["region"]) for t in spot] == [("llama-3-70b", "us-west")]
    assert spot[0]["base_url"] == "http://llama-3-70b-us-west-a100-spot.llm-serving.svc"
    assert "utilisation" not in spot[0]
    first = rendered.targets[0]
    assert first["base_url"] == "http://llama-3-70b-us-east-a100.llm-serving.svc"
    assert 'model="llama-3-70b"' in first["utilisation"]["query"]
    assert 'region="us-east"' in first["utilisation"]["query"]


def test_each_target_carries_its_model_deployments_release_rule() -> None:
    pools, models = _fleet()
    key = "llm-serving/mistral-7b"
    niw = models[key].niw.model_copy(
        update={"release_at": [0.8, 0.7], "promote_after_seconds": 600}
    )
    models[key] = models[key].model_copy(update={"niw": niw})
    rendered = render_batch_targets(pools, models, prometheus_url=PROMETHEUS)
    rules = {(t["model"], t["kind"]): t["release"] for t in rendered.targets}
    assert rules[("mistral-7b", "shared")] == {
        "one_below": 0.8,
        "two_below": 0.7,
        "promote_after_s": 600.0,
    }
    assert rules[("llama-3-70b", "shared")]["one_below"] == 0.6


def test_one_queue_per_model_and_region_and_missing_pools_are_reported() -> None:
    pools, models = _fleet()
    twin = copy.deepcopy(models["llm-serving/llama-3-70b"])
    models["team-b/llama-3-70b"] = twin  # the same served name in another namespace
    mistral = models["llm-serving/mistral-7b"]
    regions = [mistral.regions[0].model_copy(update={"pool": "no-such-pool"}), *mistral.regions[1:]]
    models["llm-serving/mistral-7b"] = mistral.model_copy(update={"regions": regions})
    rendered = render_batch_targets(pools, models, prometheus_url=PROMETHEUS)
    names = [(t["model"], t["region"], t["kind"]) for t in rendered.targets]
    assert len(names) == len(set(names))
    assert any("team-b/llama-3-70b" in line and "already" in line for line in rendered.skipped)
    assert any("no-such-pool not found" in line for line in rendered.skipped)
    urls = {t["base_url"] for t in rendered.targets}
    assert not any(".team-b.svc" in url for url in urls)  # the first namespace keeps the queue


def test_the_command_prints_targets_the_batch_service_accepts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["batch-targets", "--fleet", str(EXAMPLES), "--prometheus", PROMETHEUS])
    out = capsys.readouterr().out
    assert code == 0
    document: dict[str, Any] = yaml.safe_load(out)
    config = BatchServiceConfig.model_validate(
        {
            "store": {"kind": "sqlite", "path": str(tmp_path / "b.sqlite3")},
            "auth": {"tokens": {"sk-x": "x"}},
            **document,
        }
    )
    assert len(config.targets) == 6
    assert all(t.release is not None for t in config.targets)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prometheus", "prometheus:9090"], "must be an http(s) URL"),
        (["--prometheus", PROMETHEUS, "--max-in-flight", "0"], ">= 1"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["batch-targets", "--fleet", str(EXAMPLES), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_an_unreadable_fleet_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ModelDeployment\nmetadata: {name: x}\nspec: {regions: 7}\n")
    assert main(["batch-targets", "--fleet", str(bad), "--prometheus", PROMETHEUS]) == 2
    assert "fleetwarden batch-targets:" in capsys.readouterr().err
