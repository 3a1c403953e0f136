"""Render the sidecar's fairness config for one ModelDeployment from the TenantPolicy that selects it.

Pure: API objects in, a `FairnessConfig` out. Which TenantPolicy applies is decided here too, so the
rule is in one place: the oldest selecting policy wins (creation time, then name), and the others
are reported as conflicts instead of being merged in some order nobody chose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetwarden.api.enums import Ordering, PolicyName, Tier
from fleetwarden.api.v1alpha1 import ModelDeploymentSpec, TenantPolicySpec
from fleetwarden.fairness.config import (
    FAIRSERVE_TOKEN_WEIGHTS,
    VTC_TOKEN_WEIGHTS,
    ApplicationConfig,
    DpaConfig,
    DrrConfig,
    FairnessConfig,
    GateConfig,
    StageConfig,
    TenantConfig,
    TierConfig,
    TokenWeightsConfig,
)


@dataclass(frozen=True)
class PolicyRef:
    """A TenantPolicy as the renderer needs it."""

    namespace: str
    name: str
    created: str
    """metadata.creationTimestamp (RFC 3339 sorts correctly as text)."""
    labels_selected: bool
    """Whether its selector selects the ModelDeployment in question."""
    spec: TenantPolicySpec | None
    """None when the spec is invalid; such a policy selects nothing."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PolicyChoice:
    """Which TenantPolicy applies to a ModelDeployment, and which lost."""

    winner: PolicyRef | None
    losers: tuple[PolicyRef, ...]


def choose_policy(candidates: Sequence[PolicyRef]) -> PolicyChoice:
    """The oldest selecting, valid TenantPolicy wins; ties broken by name for determinism."""
    selecting = sorted(
        (c for c in candidates if c.labels_selected and c.spec is not None),
        key=lambda c: (c.created, c.name),
    )
    if not selecting:
        return PolicyChoice(winner=None, losers=())
    return PolicyChoice(winner=selecting[0], losers=tuple(selecting[1:]))


def default_ordering(policy: PolicyName) -> Ordering:
    """Tiered DRR orders a tenant's requests by priority; every other policy by arrival."""
    return Ordering.PRIORITY if policy is PolicyName.DRR else Ordering.FIFO


def _token_weights(spec: TenantPolicySpec) -> TokenWeightsConfig:
    base = FAIRSERVE_TOKEN_WEIGHTS if spec.policy is PolicyName.WSC else VTC_TOKEN_WEIGHTS
    given = spec.token_weights
    return TokenWeightsConfig(
        input=base["input"] if given.input is None else given.input,
        system=base["system"] if given.system is None else given.system,
        output=base["output"] if given.output is None else given.output,
    )


def _default_policy_spec(md: ModelDeploymentSpec) -> TenantPolicySpec:
    return TenantPolicySpec(policy=md.sidecar.policy)


def render_fairness_config(md: ModelDeploymentSpec, policy: PolicyRef | None) -> FairnessConfig:
    """The config every sidecar of `md` runs, from `policy` or, without one, the sidecar defaults."""
    spec = policy.spec if policy is not None and policy.spec is not None else None
    source = f"TenantPolicy {policy.key}" if spec is not None and policy is not None else "default"
    spec = spec or _default_policy_spec(md)
    return FairnessConfig(
        source=source,
        served_model=md.served_name,
        policy=spec.policy,
        ordering=spec.ordering or default_ordering(spec.policy),
        token_weights=_token_weights(spec),
        length_prediction=spec.length_prediction,
        tenants={
            t.name: TenantConfig(
                weight=t.weight,
                tier=t.tier,
                priority_factor=t.priority_factor,
                rpm=t.rpm,
                tpm=t.tpm,
            )
            for t in spec.tenants
        },
        defaults=TenantConfig(
            weight=spec.defaults.weight,
            tier=spec.defaults.tier,
            priority_factor=spec.defaults.priority_factor,
            rpm=spec.defaults.rpm,
            tpm=spec.defaults.tpm,
        ),
        applications={
            a.name: ApplicationConfig(
                rpm=a.rpm,
                tpm=a.tpm,
                stages={
                    s.name: StageConfig(input=s.input, system=s.system, output=s.output)
                    for s in a.stages
                },
            )
            for a in spec.applications
        },
        interaction_throttling=spec.interaction_throttling,
        early_rejection=spec.early_rejection,
        overload_kv_utilization=spec.overload.kv_utilization,
        drr=DrrConfig(
            unit=spec.drr.unit, quantum={Tier(k): v for k, v in spec.drr.quantum.items()}
        ),
        dpa=DpaConfig(
            severely_expired_s=spec.dpa.severely_expired_seconds,
            urgent_within_s=spec.dpa.urgent_within_seconds,
        ),
        tiers={
            Tier.IW_FAST: TierConfig(
                ttft_s=md.tiers.iw_f.ttft_seconds, tbt_s=md.tiers.iw_f.tbt_seconds
            ),
            Tier.IW_NORMAL: TierConfig(
                ttft_s=md.tiers.iw_n.ttft_seconds, tbt_s=md.tiers.iw_n.tbt_seconds
            ),
        },
        gate=GateConfig(
            max_inflight_tokens=md.sidecar.capacity_gate.max_inflight_tokens,
            max_waiting_requests=md.sidecar.capacity_gate.max_waiting_requests,
            telemetry_max_age_s=md.sidecar.capacity_gate.telemetry_max_age_seconds,
        ),
        tenant_header=md.sidecar.tenant_header,
    )
