"""The simulated fleet, loaded from the very YAML users apply: RegionPools, ModelDeployments and
TenantPolicies (e.g. `examples/`). There is no second configuration language for the simulator.

Every document is validated with the API models (`fleetwarden.api.v1alpha1`), so an object the
API server would reject is rejected here too, with the file, the document's position and the
object's name in the message. Cross-object checks are the operator's (a ModelDeployment's pools
must exist, each pool's GPU type needs a throughput entry); they are errors here instead of
conditions, because a simulation of a half-broken fleet answers no question anyone asked.

Which TenantPolicy applies to a ModelDeployment follows the operator's rule (the oldest selecting
policy in the namespace wins, ties by name); the winner is rendered into the sidecar's
`FairnessConfig` with `fleetwarden.fairness.render.render_config`, the same code the operator's
renderer calls, so a simulated pod schedules exactly as a real one would.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fleetwarden.api.v1alpha1 import (
    API_VERSION,
    ModelDeployment,
    RegionPool,
    TenantPolicy,
    TenantPolicySpec,
)
from fleetwarden.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from fleetwarden.api.v1alpha1.regionpool import RegionPoolSpec
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.render import render_config

DEFAULT_NAMESPACE = "default"
KINDS = ("RegionPool", "ModelDeployment", "TenantPolicy")


class FleetSpecError(ValueError):
    """The fleet YAML cannot be read, or an object in it is invalid; says which file and object."""


@dataclass(frozen=True)
class Source:
    """Where an object came from: file and 1-based document number, for error messages."""

    path: str
    document: int

    def __str__(self) -> str:
        return f"{self.path} (document {self.document})"


@dataclass(frozen=True)
class Pool:
    """A RegionPool, as the simulator uses it."""

    name: str
    spec: RegionPoolSpec
    source: Source

    @property
    def region(self) -> str:
        return self.spec.region

    @property
    def gpu_type(self) -> str:
        return self.spec.gpu_type


@dataclass(frozen=True)
class Placement:
    """One `regions[]` entry of a ModelDeployment, joined with its pool: a scaling endpoint."""

    pool: str
    region: str
    gpu_type: str
    min_instances: int
    max_instances: int
    throughput_tps: float
    """Tokens/s one instance serves on this pool's GPU type (SageServe's theta)."""
    gpus_per_instance: int
    cost_per_gpu_hour: float
    model_load_s: float
    spot_enabled: bool
    """The pool's `spot.enabled`. Read only by the simulator's opt-in SageServe spot donation
    (`fleetwarden.sim.spot_donation`), which the operator does not implement."""
    spot_max_instances: int | None
    """The pool's `spot.maxInstances` (None: bounded by capacity only); as `spot_enabled`."""


@dataclass(frozen=True)
class Model:
    """A ModelDeployment with its placements resolved and its fairness config rendered."""

    namespace: str
    name: str
    spec: ModelDeploymentSpec
    labels: Mapping[str, str]
    placements: tuple[Placement, ...]
    fairness: FairnessConfig
    source: Source
    max_model_len: int | None = None
    """`--max-model-len` from the engine args: longer requests are refused, as vLLM does."""
    created: str = ""
    """metadata.creationTimestamp (empty if the YAML has none): first-come order on shared pools,
    as the operator's pool accounting places ModelDeployments."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def served_name(self) -> str:
        return self.spec.served_name

    @property
    def regions(self) -> tuple[str, ...]:
        """Regions served, in declaration order, each once."""
        return tuple(dict.fromkeys(p.region for p in self.placements))

    def placement(self, pool: str) -> Placement:
        for placement in self.placements:
            if placement.pool == pool:
                return placement
        raise KeyError(f"{self.key} has no placement in pool {pool}")


@dataclass(frozen=True)
class Policy:
    """A TenantPolicy with what the selection rule needs."""

    namespace: str
    name: str
    created: str
    spec: TenantPolicySpec
    source: Source

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Fleet:
    """Everything the simulator needs to know about the fleet, validated and cross-checked."""

    pools: Mapping[str, Pool]
    models: Mapping[str, Model]
    """By `namespace/name`, in load order."""
    policies: Mapping[str, Policy] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()
    """Documents of other kinds (e.g. Namespaces), ignored; one line each for the report."""

    def model(self, name: str) -> Model:
        """A model by served name, `namespace/name` or plain name (if unambiguous)."""
        if name in self.models:
            return self.models[name]
        found = [m for m in self.models.values() if name in (m.served_name, m.name)]
        if len(found) == 1:
            return found[0]
        if not found:
            known = sorted(m.served_name for m in self.models.values())
            raise KeyError(f"no ModelDeployment serves {name!r}; served names: {known}")
        raise KeyError(f"{name!r} is ambiguous: {sorted(m.key for m in found)}")

    @property
    def regions(self) -> tuple[str, ...]:
        return tuple(sorted({p.region for p in self.pools.values()}))


def _yaml_files(paths: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
            files.extend(p for p in found if p.is_file())
        elif path.is_file():
            files.append(path)
        else:
            raise FleetSpecError(f"{path}: no such file or directory")
    if not files:
        raise FleetSpecError(f"no YAML files in {', '.join(str(p) for p in paths)}")
    return files


def _documents(path: Path) -> list[tuple[Source, dict[str, Any]]]:
    try:
        loaded = list(yaml.safe_load_all(path.read_text()))
    except (OSError, UnicodeDecodeError) as exc:
        raise FleetSpecError(f"{path}: cannot read: {exc}") from exc
    except yaml.YAMLError as exc:
        raise FleetSpecError(f"{path}: not valid YAML: {exc}") from exc
    documents: list[tuple[Source, dict[str, Any]]] = []
    for index, doc in enumerate(loaded, start=1):
        if doc is None:
            continue
        source = Source(str(path), index)
        if not isinstance(doc, dict):
            raise FleetSpecError(f"{source}: a Kubernetes object must be a mapping")
        documents.append((source, doc))
    return documents


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(object)"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def _meta(doc: Mapping[str, Any], source: Source) -> tuple[str, str, dict[str, str], str]:
    metadata = doc.get("metadata") or {}
    if not isinstance(metadata, dict) or not metadata.get("name"):
        raise FleetSpecError(f"{source}: {doc.get('kind')} without metadata.name")
    labels = metadata.get("labels") or {}
    if not isinstance(labels, dict):
        raise FleetSpecError(f"{source}: metadata.labels must be a mapping")
    return (
        str(metadata["name"]),
        str(metadata.get("namespace") or DEFAULT_NAMESPACE),
        {str(k): str(v) for k, v in labels.items()},
        str(metadata.get("creationTimestamp") or ""),
    )


def _max_model_len(args: Sequence[str]) -> int | None:
    """`--max-model-len N` or `--max-model-len=N` from the engine's arguments, if given."""
    tokens = [t for arg in args for t in shlex.split(arg)]
    for index, token in enumerate(tokens):
        value: str | None = None
        if token == "--max-model-len" and index + 1 < len(tokens):
            value = tokens[index + 1]
        elif token.startswith("--max-model-len="):
            value = token.split("=", 1)[1]
        if value is not None and value.isdigit():
            return int(value)
    return None


def choose_policy(model_ns: str, labels: Mapping[str, str], policies: Iterable[Policy]) -> Policy:
    """The operator's rule: the oldest selecting TenantPolicy in the namespace, ties by name."""
    selecting = sorted(
        (p for p in policies if p.namespace == model_ns and p.spec.selector.matches(dict(labels))),
        key=lambda p: (p.created, p.name),
    )
    if not selecting:
        raise LookupError("no TenantPolicy selects this ModelDeployment")
    return selecting[0]


def _render(spec: ModelDeploymentSpec, policy: Policy | None) -> FairnessConfig:
    """As `operator.fairness_render.render_fairness_config` (which `sim` may not import)."""
    return render_config(
        served_model=spec.served_name,
        spec=policy.spec if policy is not None else TenantPolicySpec(policy=spec.sidecar.policy),
        tiers=spec.tiers,
        sidecar=spec.sidecar,
        source=f"TenantPolicy {policy.key}" if policy is not None else "default",
    )


def _placements(
    name: str, spec: ModelDeploymentSpec, pools: Mapping[str, Pool], source: Source
) -> tuple[Placement, ...]:
    placements: list[Placement] = []
    for entry in spec.regions:
        pool = pools.get(entry.pool)
        if pool is None:
            raise FleetSpecError(
                f"{source}: ModelDeployment {name}: pool {entry.pool!r} is not defined "
                f"(RegionPools: {sorted(pools)})"
            )
        throughput = spec.throughput.get(pool.gpu_type)
        if throughput is None:
            raise FleetSpecError(
                f"{source}: ModelDeployment {name}: no throughput for GPU type {pool.gpu_type!r} "
                f"of pool {pool.name} (throughput has {sorted(spec.throughput)})"
            )
        placements.append(
            Placement(
                pool=pool.name,
                region=pool.region,
                gpu_type=pool.gpu_type,
                min_instances=entry.min_instances,
                max_instances=entry.max_instances,
                throughput_tps=float(throughput),
                gpus_per_instance=spec.model.gpus_per_instance,
                cost_per_gpu_hour=pool.spec.cost_per_hour,
                model_load_s=float(pool.spec.model_load_seconds),
                spot_enabled=pool.spec.spot.enabled,
                spot_max_instances=pool.spec.spot.max_instances,
            )
        )
    return tuple(placements)


def load_fleet(paths: Path | Sequence[Path]) -> Fleet:
    """Load and validate a fleet from YAML files or directories (multi-document files allowed)."""
    files = _yaml_files([paths] if isinstance(paths, Path) else list(paths))
    pools: dict[str, Pool] = {}
    raw_models: list[tuple[Source, str, str, dict[str, str], str, ModelDeploymentSpec]] = []
    policies: dict[str, Policy] = {}
    skipped: list[str] = []
    for path in files:
        for source, doc in _documents(path):
            kind = doc.get("kind")
            if doc.get("apiVersion") != API_VERSION or kind not in KINDS:
                if str(doc.get("apiVersion", "")).startswith("fleetwarden.dev/"):
                    raise FleetSpecError(
                        f"{source}: unknown fleetwarden kind {kind!r} or version "
                        f"{doc.get('apiVersion')!r} (expected {API_VERSION}, kinds {KINDS})"
                    )
                skipped.append(f"{source}: {doc.get('apiVersion')} {kind}")
                continue
            name, namespace, labels, created = _meta(doc, source)
            body = {k: v for k, v in doc.items() if k != "status"}
            try:
                if kind == "RegionPool":
                    pool_spec = RegionPool.model_validate(body).spec
                elif kind == "ModelDeployment":
                    md_spec = ModelDeployment.model_validate(body).spec
                else:
                    tp_spec = TenantPolicy.model_validate(body).spec
            except ValidationError as exc:
                shown = name if kind == "RegionPool" else f"{namespace}/{name}"
                raise FleetSpecError(f"{source}: {kind} {shown}: {_describe(exc)}") from exc
            if kind == "RegionPool":
                if name in pools:
                    raise FleetSpecError(
                        f"{source}: RegionPool {name} defined twice (first in {pools[name].source})"
                    )
                pools[name] = Pool(name, pool_spec, source)
            elif kind == "ModelDeployment":
                raw_models.append((source, namespace, name, labels, created, md_spec))
            else:
                loaded = Policy(namespace, name, created, tp_spec, source)
                if loaded.key in policies:
                    raise FleetSpecError(f"{source}: TenantPolicy {loaded.key} defined twice")
                policies[loaded.key] = loaded
    models: dict[str, Model] = {}
    for source, namespace, name, labels, created, spec in raw_models:
        key = f"{namespace}/{name}"
        if key in models:
            raise FleetSpecError(f"{source}: ModelDeployment {key} defined twice")
        try:
            policy: Policy | None = choose_policy(namespace, labels, policies.values())
        except LookupError:
            policy = None
        models[key] = Model(
            namespace=namespace,
            name=name,
            spec=spec,
            labels=labels,
            placements=_placements(key, spec, pools, source),
            fairness=_render(spec, policy),
            source=source,
            max_model_len=_max_model_len(spec.model.engine.args),
            created=created,
        )
    served = [m.served_name for m in models.values()]
    clashes = sorted({s for s in served if served.count(s) > 1})
    if clashes:
        raise FleetSpecError(f"several ModelDeployments serve {clashes}; served names must differ")
    if not models:
        raise FleetSpecError(f"no ModelDeployment in {', '.join(str(f) for f in files)}")
    return Fleet(pools=pools, models=models, policies=policies, skipped=tuple(skipped))
