"""TenantPolicy: fairness among tenants and applications inside every serving pod.

The operator renders one fairness config per selected ModelDeployment from this resource, writes it
into the ModelDeployment's ConfigMaps (the source of truth on restart) and pushes it to the sidecars.
Token weights default by policy: VTC charges {input 1, output 2} as in the VTC paper, WSC charges
{input 1, system 2, output 1} as in FairServe; set them to override.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from fleetwarden.api.enums import LengthPrediction, Ordering, PolicyName, QuantumUnit, Tier
from fleetwarden.api.v1alpha1.common import (
    ApiModel,
    Condition,
    DnsLabel,
    FiniteFloat,
    LabelSelector,
    NonEmptyName,
    list_map,
)

TenantName = NonEmptyName


class TokenWeights(ApiModel):
    """How much one token of each kind costs in the fairness counters. Empty fields default by policy."""

    input: FiniteFloat | None = Field(default=None, ge=0)
    """Weight of a user-input (prompt) token (VTC's w_p, FairServe's alpha)."""
    system: FiniteFloat | None = Field(default=None, ge=0)
    """Weight of a system-prompt token (FairServe's beta); VTC counts these as input."""
    output: FiniteFloat | None = Field(default=None, ge=0)
    """Weight of a generated token (VTC's w_q, FairServe's gamma)."""


class TenantSettings(ApiModel):
    """One tenant's share and limits."""

    name: TenantName
    """Tenant name, as the gateway's trusted header or the OpenAI `user` field carries it."""
    weight: float = Field(default=1.0, gt=0, le=1e6)
    """Share of service relative to other tenants (weighted VTC divides charges by it)."""
    tier: Tier = Tier.IW_NORMAL
    """Tier of the tenant's requests: iw-f, iw-n or niw. A request's `x-fleetwarden-tier` header
    may lower it, or claim iw-n (the batch service's promotion), never iw-f unless set here."""
    priority_factor: float = Field(default=1.0, gt=0, le=1e3)
    """FairServe's E: multiplies the tenant's measured service, so E < 1 means preference."""
    rpm: int | None = Field(default=None, ge=1)
    """Requests per minute; empty means unlimited."""
    tpm: int | None = Field(default=None, ge=1)
    """Tokens (input + output) per minute; empty means unlimited."""


class TenantDefaults(ApiModel):
    """Settings for tenants not listed by name."""

    weight: float = Field(default=1.0, gt=0, le=1e6)
    """Share of service."""
    tier: Tier = Tier.IW_NORMAL
    """Tier, as for a named tenant (only iw-f is out of a header's reach)."""
    priority_factor: float = Field(default=1.0, gt=0, le=1e3)
    """FairServe's E."""
    rpm: int | None = Field(default=None, ge=1)
    """Requests per minute; empty means unlimited."""
    tpm: int | None = Field(default=None, ge=1)
    """Tokens per minute; empty means unlimited."""


class StageExpectation(ApiModel):
    """Expected tokens of one interaction stage (FairServe's N_I, N_S, N_O)."""

    name: DnsLabel
    """Stage name, as the client's `x-fleetwarden-stage` header names it."""
    input: int = Field(default=0, ge=0)
    """Expected user-input tokens."""
    system: int = Field(default=0, ge=0)
    """Expected system-prompt tokens."""
    output: int = Field(default=0, ge=0)
    """Expected generated tokens."""

    @model_validator(mode="after")
    def _some_tokens(self) -> StageExpectation:
        if self.input + self.system + self.output == 0:
            raise ValueError(f"stage {self.name} expects no tokens at all")
        return self


class ApplicationSettings(ApiModel):
    """An application (a multi-call agent or workflow) and what its interactions cost."""

    name: DnsLabel
    """Application name, as the `x-fleetwarden-app` header carries it."""
    rpm: int | None = Field(default=None, ge=1)
    """Requests per minute over all users of the application; empty means unlimited."""
    tpm: int | None = Field(default=None, ge=1)
    """Tokens per minute over all users; empty means unlimited."""
    stages: list[StageExpectation] = Field(
        default_factory=list, max_length=64, json_schema_extra=list_map("name")
    )
    """Expected tokens per interaction stage; WSC normalises service by them."""


class DrrSettings(ApiModel):
    """Deficit round robin."""

    unit: QuantumUnit = QuantumUnit.TOKENS
    """Whether quanta count tokens or requests."""
    quantum: dict[str, int] = Field(
        default_factory=lambda: {"iw-f": 4096, "iw-n": 2048, "niw": 1024},
        json_schema_extra={"additionalProperties": {"type": "integer", "minimum": 1}},
    )
    """Quantum per tier (keys iw-f, iw-n, niw) added to a tenant's deficit each round."""

    @model_validator(mode="after")
    def _known_tiers(self) -> DrrSettings:
        unknown = set(self.quantum) - {t.value for t in Tier}
        if unknown:
            raise ValueError(f"quantum has unknown tiers {sorted(unknown)}; use iw-f, iw-n, niw")
        if any(v < 1 for v in self.quantum.values()):
            raise ValueError("quanta must be >= 1")
        return self


class DpaSettings(ApiModel):
    """SageServe's deadline-and-priority-aware ordering (section 6.5)."""

    severely_expired_seconds: FiniteFloat = Field(default=2.0, ge=0)
    """tau_n: a request this far past its deadline is severely expired and goes first."""
    urgent_within_seconds: FiniteFloat = Field(default=0.5, ge=0)
    """tau_p: a request this close to its deadline is urgent."""


class OverloadSettings(ApiModel):
    """When the engine counts as overloaded (FairServe's OIT throttles only then)."""

    kv_utilization: float = Field(default=0.90, gt=0, le=1)
    """KV-cache utilisation at or above which the engine is overloaded."""


class TenantPolicySpec(ApiModel):
    """Desired state of a TenantPolicy."""

    selector: LabelSelector = Field(default_factory=LabelSelector)
    """ModelDeployments (in this namespace) the policy applies to; empty selects all."""
    policy: PolicyName = PolicyName.VTC
    """Scheduler across tenants: fcfs, lcf, vtc, wsc or drr."""
    ordering: Ordering | None = None
    """Order inside a tenant (or overall, under fcfs): fifo, priority, edf or dpa. Empty means
    priority (then deadline, then arrival) under drr, as tiered DRR does, and fifo otherwise."""
    token_weights: TokenWeights = Field(default_factory=TokenWeights)
    """Cost per token kind; empty fields default by policy."""
    length_prediction: LengthPrediction = LengthPrediction.NONE
    """VTC: charge a predicted output length at dispatch and settle on completion."""
    tenants: list[TenantSettings] = Field(
        default_factory=list, max_length=4096, json_schema_extra=list_map("name")
    )
    """Tenants with their own settings."""
    defaults: TenantDefaults = Field(default_factory=TenantDefaults)
    """Settings for every tenant not listed."""
    applications: list[ApplicationSettings] = Field(
        default_factory=list, max_length=1024, json_schema_extra=list_map("name")
    )
    """Applications with their limits and stage expectations."""
    interaction_throttling: bool = False
    """FairServe's OIT: apply rpm limits only while overloaded, never to a continuing interaction."""
    early_rejection: bool = True
    """Answer 429 at once when the backlog means a request cannot meet its tier's TTFT target."""
    drr: DrrSettings = Field(default_factory=DrrSettings)
    """Deficit round robin."""
    dpa: DpaSettings = Field(default_factory=DpaSettings)
    """Deadline-and-priority-aware ordering."""
    overload: OverloadSettings = Field(default_factory=OverloadSettings)
    """Overload detection."""

    @model_validator(mode="after")
    def _unique_names(self) -> TenantPolicySpec:
        for what, names in (
            ("tenants", [t.name for t in self.tenants]),
            ("applications", [a.name for a in self.applications]),
        ):
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise ValueError(f"{what} lists {duplicates} more than once")
        return self


class TenantPolicyStatus(ApiModel):
    """Observed state of a TenantPolicy, written by the operator only."""

    observed_generation: int | None = None
    """The .metadata.generation this status reflects."""
    config_version: str | None = None
    """Version of the rendered fairness config (a content hash)."""
    model_deployments: list[str] = Field(default_factory=list, max_length=4096)
    """ModelDeployments the config is rendered for."""
    pods_acknowledged: int = 0
    """Sidecars that report the current config version."""
    pods_total: int = 0
    """Ready sidecars of the selected ModelDeployments."""
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16, json_schema_extra=list_map("type")
    )
    """Ready, Degraded (e.g. conflicts with another TenantPolicy)."""


class TenantPolicy(ApiModel):
    """Fairness for tenants and applications."""

    api_version: str = "fleetwarden.dev/v1alpha1"
    kind: str = "TenantPolicy"
    metadata: dict[str, object] = Field(default_factory=dict)
    spec: TenantPolicySpec
    status: TenantPolicyStatus | None = None
