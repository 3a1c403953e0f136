"""Small fleets written as the custom-resource YAML users apply, for the simulator's tests."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

from fleetwarden.sim.fleet_spec import Fleet, load_fleet


def pool_yaml(
    name: str = "pool-a",
    region: str = "region-a",
    *,
    gpus: int = 64,
    load_s: int = 600,
    cost: float = 2.0,
    spot: bool = False,
    extra: str = "",
) -> str:
    spot_block = "\n  spot:\n    enabled: true" if spot else ""
    return (
        dedent(
            f"""\
        apiVersion: fleetwarden.dev/v1alpha1
        kind: RegionPool
        metadata:
          name: {name}
        spec:
          region: {region}
          gpuType: A100-80GB
          capacity:
            gpus: {gpus}
          costPerHour: {cost}
          modelLoadSeconds: {load_s}"""
        )
        + spot_block
        + extra
        + "\n"
    )


def model_yaml(
    name: str = "m",
    regions: tuple[tuple[str, int, int], ...] = (("pool-a", 1, 1),),
    *,
    throughput: float = 2000.0,
    policy: str = "fcfs",
    labels: str = "",
    scaling: str = "",
    namespace: str = "ns",
) -> str:
    entries = "\n".join(
        f"    - pool: {p}\n      minInstances: {lo}\n      maxInstances: {hi}"
        for p, lo, hi in regions
    )
    label_block = f"\n  labels:\n    {labels}" if labels else ""
    scaling_block = f"\n  scaling:\n{scaling}" if scaling else ""
    return (
        dedent(
            f"""\
            apiVersion: fleetwarden.dev/v1alpha1
            kind: ModelDeployment
            metadata:
              name: {name}
              namespace: {namespace}"""
        )
        + label_block
        + dedent(
            f"""
            spec:
              model:
                name: org/{name}
              throughput:
                A100-80GB: {throughput}
              regions:
            """
        )
        + entries
        + scaling_block
        + f"\n  sidecar:\n    policy: {policy}\n"
    )


def write_fleet(directory: Path, *documents: str) -> Fleet:
    """Write `documents` as one multi-document file and load it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "fleet.yaml"
    path.write_text("---\n".join(documents))
    return load_fleet(directory)
