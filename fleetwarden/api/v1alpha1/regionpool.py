"""RegionPool: a GPU node pool in one region, the unit the planner allocates instances from.

Cluster-scoped, because one pool is shared by ModelDeployments in many namespaces and its capacity
is a fact about hardware, not about any one team.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from fleetwarden.api.v1alpha1.common import (
    ApiModel,
    Condition,
    DnsLabel,
    FiniteFloat,
    NonEmptyName,
    Toleration,
    list_map,
    validations,
)


class PoolCapacity(ApiModel):
    """How much the pool can hold. Give GPUs, instances or both; every bound given is enforced."""

    model_config = {
        "json_schema_extra": validations(
            ("has(self.gpus) || has(self.instances)", "capacity needs gpus or instances (or both)"),
        )
    }

    gpus: int | None = Field(default=None, ge=1)
    """Total GPUs in the pool. Instances of a model use `gpusPerInstance` GPUs each."""
    instances: int | None = Field(default=None, ge=1)
    """Most serving instances the pool may run, whatever their size (e.g. a node count)."""

    @model_validator(mode="after")
    def _one_bound_given(self) -> PoolCapacity:
        if self.gpus is None and self.instances is None:
            raise ValueError("capacity needs gpus or instances (or both)")
        return self


class SpotSettings(ApiModel):
    """Spot (preemptible) nodes of the same pool, used for non-interactive work only."""

    enabled: bool = False
    """Whether the pool has spot nodes that NIW work may use."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels that select the spot nodes."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Tolerations for the spot nodes' taints."""
    reclaim_seconds: int = Field(default=30, ge=0, le=3600)
    """Notice the cloud gives before reclaiming a spot node. The operator and the batch service
    do not read it (an evicted spot pod's in-flight NIW items return to the queue whatever the
    notice); it is read, if at all, only by the simulator."""
    cost_per_hour: FiniteFloat | None = Field(default=None, ge=0)
    """Cost of one spot GPU for one hour. Not read yet: the planner, the operator, the batch
    service and the simulator's reports ignore it (spot capacity is not costed anywhere)."""
    max_instances: int | None = Field(default=None, ge=0)
    """Most spot instances the pool may run; empty means bounded by capacity only."""


class RegionPoolSpec(ApiModel):
    """Desired state of a RegionPool."""

    region: DnsLabel
    """Region the pool lives in, e.g. us-east. ModelDeployments get one serving Deployment per region."""
    gpu_type: NonEmptyName
    """GPU type of every node, e.g. A100-80GB. ModelDeployments declare throughput per GPU type."""
    capacity: PoolCapacity
    """How many GPUs or instances the pool holds."""
    cost_per_hour: FiniteFloat = Field(ge=0)
    """Cost of one GPU for one hour (SageServe's alpha_k), in any currency used consistently."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels that select this pool's nodes; copied onto every serving pod."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Tolerations for the pool's taints (e.g. nvidia.com/gpu); copied onto every serving pod."""
    spot: SpotSettings = Field(default_factory=SpotSettings)
    """Spot nodes for non-interactive work."""
    model_load_seconds: int = Field(default=600, ge=0, le=86400)
    """Time from pod start to serving: pulling weights and warming up (SageServe: about 10 min)."""
    topology_key: str = Field(default="topology.kubernetes.io/zone", min_length=1, max_length=316)
    """Node label that serving pods are spread across (zones inside the region)."""


class ModelAllocation(ApiModel):
    """Instances of one ModelDeployment placed in this pool."""

    model_deployment: str
    """namespace/name of the ModelDeployment."""
    instances: int = Field(ge=0)
    """Instances the ModelDeployment currently wants here."""
    gpus: int = Field(ge=0)
    """GPUs those instances use."""


class RegionPoolStatus(ApiModel):
    """Observed state of a RegionPool, written by the operator only."""

    observed_generation: int | None = None
    """The .metadata.generation this status reflects."""
    allocations: list[ModelAllocation] = Field(
        default_factory=list, max_length=4096, json_schema_extra=list_map("modelDeployment")
    )
    """Instances per ModelDeployment."""
    allocated_instances: int = 0
    """Sum of instances over all ModelDeployments."""
    allocated_gpus: int = 0
    """Sum of GPUs over all ModelDeployments."""
    free_instances: int | None = None
    """Instances still free, when capacity is given in instances (negative when overcommitted)."""
    free_gpus: int | None = None
    """GPUs still free, when capacity is given in GPUs (negative when overcommitted)."""
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16, json_schema_extra=list_map("type")
    )
    """Ready, Degraded (overcommitted)."""


class RegionPool(ApiModel):
    """A GPU node pool in one region."""

    api_version: str = "fleetwarden.dev/v1alpha1"
    kind: str = "RegionPool"
    metadata: dict[str, object] = Field(default_factory=dict)
    spec: RegionPoolSpec
    status: RegionPoolStatus | None = None
