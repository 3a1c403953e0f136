"""Fluent builders of API objects for operator tests (after Kueue's MakeClusterQueue style)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec, RegionPoolSpec
from fleetwarden.operator import builders
from fleetwarden.operator.fairness_render import render_fairness_config
from fleetwarden.operator.fleet import FleetView, ObjectRecord

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_objects() -> list[dict[str, Any]]:
    """Every object in examples/*.yaml, in apply order."""
    objects: list[dict[str, Any]] = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return objects


def example(kind: str, name: str) -> dict[str, Any]:
    for obj in example_objects():
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return copy.deepcopy(obj)
    raise KeyError((kind, name))


def record(
    obj: dict[str, Any],
    *,
    uid: str | None = None,
    created: str = "2026-01-01T00:00:00Z",
    generation: int = 1,
    status: dict[str, Any] | None = None,
) -> ObjectRecord:
    body = copy.deepcopy(obj)
    metadata = body.setdefault("metadata", {})
    metadata.setdefault("uid", uid or f"uid-{metadata['name']}")
    metadata.setdefault("creationTimestamp", created)
    metadata.setdefault("generation", generation)
    if status is not None:
        body["status"] = status
    return ObjectRecord.from_body(body)


def example_view() -> FleetView:
    objs = example_objects()
    return FleetView.of(
        pools=[record(o) for o in objs if o["kind"] == "RegionPool"],
        model_deployments=[record(o) for o in objs if o["kind"] == "ModelDeployment"],
        tenant_policies=[
            record(o, created=f"2026-01-01T00:00:0{i}Z")
            for i, o in enumerate(x for x in objs if x["kind"] == "TenantPolicy")
        ],
    )


def region_target(
    pool_name: str = "us-east-a100", replicas: int = 2, **spec_changes: Any
) -> builders.RegionTarget:
    """One region of the example llama-3-70b, its spec fields (camelCase) replaced by
    `spec_changes`: what the builders turn into that region's children."""
    spec = {**example("ModelDeployment", "llama-3-70b")["spec"], **spec_changes}
    md = ModelDeploymentSpec.model_validate(spec)
    pool = RegionPoolSpec.model_validate(example("RegionPool", pool_name)["spec"])
    placement = next(p for p in md.regions if p.pool == pool_name)
    config = render_fairness_config(md, None)
    return builders.RegionTarget(
        owner=builders.Owner(name="llama-3-70b", namespace="llm-serving", uid="u-1"),
        spec=md,
        placement=placement,
        pool=pool,
        replicas=replicas,
        sidecar_image="example/sidecar:1",
        config_document=config.to_document(),
        config_version=config.version,
    )
