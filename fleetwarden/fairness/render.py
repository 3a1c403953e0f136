"""Resolve a TenantPolicy spec (plus the ModelDeployment's tiers and sidecar settings) into the
`FairnessConfig` a sidecar runs: every default applied, nothing left for the sidecar to look up.

It lives in the fairness core, not the operator, so a sidecar started without a pushed config
(standalone, or before the operator's first push) resolves its defaults with the very same code.
"""

from __future__ import annotations

from fleetwarden.api.enums import Ordering, PolicyName, Tier
from fleetwarden.api.v1alpha1 import TenantPolicySpec
from fleetwarden.api.v1alpha1.modeldeployment import SidecarSettings, TierSettings
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


def render_config(
    *,
    served_model: str,
    spec: TenantPolicySpec,
    tiers: TierSettings,
    sidecar: SidecarSettings,
    source: str,
) -> FairnessConfig:
    """The resolved config of `spec` for a model served with these tiers and sidecar settings."""
    return FairnessConfig(
        source=source,
        served_model=served_model,
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
            Tier.IW_FAST: TierConfig(ttft_s=tiers.iw_f.ttft_seconds, tbt_s=tiers.iw_f.tbt_seconds),
            Tier.IW_NORMAL: TierConfig(
                ttft_s=tiers.iw_n.ttft_seconds, tbt_s=tiers.iw_n.tbt_seconds
            ),
        },
        gate=GateConfig(
            max_inflight_tokens=sidecar.capacity_gate.max_inflight_tokens,
            max_waiting_requests=sidecar.capacity_gate.max_waiting_requests,
            telemetry_max_age_s=sidecar.capacity_gate.telemetry_max_age_seconds,
        ),
        tenant_header=sidecar.tenant_header,
    )


def standalone_config(served_model: str) -> FairnessConfig:
    """What a sidecar runs with no config file: the CRD defaults of every setting."""
    sidecar = SidecarSettings()
    return render_config(
        served_model=served_model,
        spec=TenantPolicySpec(policy=sidecar.policy),
        tiers=TierSettings(),
        sidecar=sidecar,
        source="default",
    )
