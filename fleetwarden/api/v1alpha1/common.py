"""Types shared by the three custom resources, and the base model they all derive from.

Every model serialises with camelCase aliases (the Kubernetes convention) and forbids unknown fields:
the API server prunes unknown fields before the operator sees an object, so an unknown field here
means a programming error or a hand-made object, and both deserve a clear error, not a silent drop.
Attribute docstrings become the schema's `description`, so `kubectl explain` documents every field.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "fleetwarden.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

MAX_CONDITIONS = 16
"""Conditions are keyed by type; the cap keeps a buggy writer from growing status without bound."""


def validations(*rules: tuple[str, str]) -> dict[str, Any]:
    """CEL `x-kubernetes-validations` for a schema node: (rule, message) pairs.

    Cross-field rules live in the CRD so the API server rejects bad objects at `kubectl apply`, before
    the operator ever sees them; the pydantic validators repeat them for objects made in Python.
    """
    return {"x-kubernetes-validations": [{"rule": rule, "message": msg} for rule, msg in rules]}


def list_map(*keys: str) -> dict[str, Any]:
    """Mark a list as a map keyed by `keys`: the API server then rejects duplicate keys."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


class ApiModel(BaseModel):
    """Base of every CRD model: camelCase on the wire, unknown fields rejected, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        use_enum_values=False,
    )

    def to_k8s(self) -> dict[str, Any]:
        """The object as it appears in Kubernetes JSON: camelCase, enums as strings, no nulls."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


DnsLabel = Annotated[
    str,
    Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
]
"""A Kubernetes DNS-1123 label: names of pools, regions, tenants and the like."""

DnsSubdomain = Annotated[
    str,
    Field(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    ),
]
"""A Kubernetes DNS-1123 subdomain: the names of Secrets, ConfigMaps and most other objects."""

NonEmptyName = Annotated[str, Field(min_length=1, max_length=253)]

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
"""A float that is neither infinite nor NaN. YAML reads `.inf` and `.nan` as floats (custom
resources given to `fleetwarden plan --fleet`, objects made in Python), the CRD schema has no way
to forbid them, and a throughput or cost that is not finite turns the planner's rows into NaN."""


class TolerationOperator(StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Toleration(ApiModel):
    """A pod toleration, as in core/v1, copied onto the serving pods of a pool."""

    key: str | None = Field(default=None, max_length=316)
    """Taint key to tolerate; empty with operator Exists tolerates every taint."""
    operator: TolerationOperator = TolerationOperator.EQUAL
    """Exists or Equal."""
    value: str | None = Field(default=None, max_length=63)
    """Taint value to match when the operator is Equal."""
    effect: TaintEffect | None = None
    """Taint effect to match; empty matches all effects."""
    toleration_seconds: int | None = Field(default=None, ge=0)
    """How long a NoExecute taint is tolerated before eviction; empty means forever."""


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """A status condition with the fields of metav1.Condition."""

    type: str = Field(max_length=316)
    """CamelCase condition type, e.g. Ready, Progressing, Degraded."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: str = Field(max_length=1024)
    """CamelCase machine-readable reason for the last transition."""
    message: str = Field(default="", max_length=32768)
    """Human-readable detail."""
    last_transition_time: datetime
    """When the status last changed (not when the condition was last written)."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The .metadata.generation the condition was computed from."""


class LabelSelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(ApiModel):
    """One label selector expression, as in metav1.LabelSelectorRequirement."""

    key: str = Field(min_length=1, max_length=316)
    """The label key."""
    operator: LabelSelectorOperator
    """In, NotIn, Exists or DoesNotExist."""
    values: list[str] = Field(default_factory=list, max_length=64)
    """Values for In and NotIn; must be empty for Exists and DoesNotExist."""


class LabelSelector(ApiModel):
    """A label selector, as in metav1.LabelSelector. An empty selector selects everything."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    """Labels that must all match exactly."""
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=32)
    """Expressions that must all hold."""

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether an object with `labels` is selected."""
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for expr in self.match_expressions:
            present = expr.key in labels
            value = labels.get(expr.key)
            if expr.operator is LabelSelectorOperator.IN and value not in expr.values:
                return False
            if expr.operator is LabelSelectorOperator.NOT_IN and present and value in expr.values:
                return False
            if expr.operator is LabelSelectorOperator.EXISTS and not present:
                return False
            if expr.operator is LabelSelectorOperator.DOES_NOT_EXIST and present:
                return False
        return True


class EnvVar(ApiModel):
    """A literal environment variable for a container."""

    name: str = Field(min_length=1, max_length=256)
    """Variable name."""
    value: str = ""
    """Variable value."""


class ContainerResources(ApiModel):
    """CPU and memory for a container, as Kubernetes quantities (GPUs are set by the operator)."""

    cpu: str | None = Field(default=None, pattern=r"^[0-9]+(\.[0-9]+)?m?$")
    """CPU request and limit, e.g. "8" or "500m"."""
    memory: str | None = Field(default=None, pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$")
    """Memory request and limit, e.g. "64Gi"."""
