"""Render the sidecar's fairness config for one ModelDeployment from the TenantPolicy that selects it.

Pure: API objects in, a `FairnessConfig` out. Which TenantPolicy applies is decided here too, so the
rule is in one place: the oldest selecting policy wins (creation time, then name), and the others
are reported as conflicts instead of being merged in some order nobody chose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec, TenantPolicySpec
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.render import default_ordering, render_config


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
    """None when the spec is invalid. Such a policy still selects (by its raw selector, see
    `FleetView.policy_refs`) and can still win: the reconciler then keeps the config last applied
    and reports the policy, instead of quietly switching to the defaults."""
    error: str | None = None
    """Why `spec` is None."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PolicyChoice:
    """Which TenantPolicy applies to a ModelDeployment, and which lost."""

    winner: PolicyRef | None
    losers: tuple[PolicyRef, ...]


def choose_policy(candidates: Sequence[PolicyRef]) -> PolicyChoice:
    """The oldest selecting TenantPolicy wins; ties broken by name for determinism.

    An invalid policy takes part too: skipping it would hand its ModelDeployments to a younger
    policy or to the defaults because of a typo. A winner with `spec` None means "keep the
    config last applied" (the ModelDeployment reconciler does that and reports it).
    """
    selecting = sorted(
        (c for c in candidates if c.labels_selected),
        key=lambda c: (c.created, c.name),
    )
    if not selecting:
        return PolicyChoice(winner=None, losers=())
    return PolicyChoice(winner=selecting[0], losers=tuple(selecting[1:]))


def render_fairness_config(md: ModelDeploymentSpec, policy: PolicyRef | None) -> FairnessConfig:
    """The config every sidecar of `md` runs, from `policy` or, without one, the sidecar defaults."""
    spec = policy.spec if policy is not None and policy.spec is not None else None
    source = f"TenantPolicy {policy.key}" if spec is not None and policy is not None else "default"
    return render_config(
        served_model=md.served_name,
        spec=spec or TenantPolicySpec(policy=md.sidecar.policy),
        tiers=md.tiers,
        sidecar=md.sidecar,
        source=source,
    )


__all__ = [
    "PolicyChoice",
    "PolicyRef",
    "choose_policy",
    "default_ordering",
    "render_fairness_config",
]
