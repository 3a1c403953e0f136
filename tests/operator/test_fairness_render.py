"""Which TenantPolicy applies, and what the rendered sidecar config says."""

from __future__ import annotations

from fleetwarden.api.enums import Ordering, PolicyName, Tier
from fleetwarden.api.v1alpha1 import ModelDeploymentSpec, TenantPolicySpec
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.operator.fairness_render import PolicyRef, choose_policy, render_fairness_config
from tests.operator.fixtures import example


def _md(name: str = "mistral-7b") -> ModelDeploymentSpec:
    return ModelDeploymentSpec.model_validate(example("ModelDeployment", name)["spec"])


def _ref(
    name: str, created: str, selected: bool = True, spec: TenantPolicySpec | None = None
) -> PolicyRef:
    return PolicyRef("ns", name, created, selected, spec or TenantPolicySpec())


def test_oldest_selecting_policy_wins_and_others_are_losers() -> None:
    choice = choose_policy(
        [_ref("b", "2026-01-02"), _ref("a", "2026-01-03"), _ref("c", "2026-01-01", selected=False)]
    )
    assert choice.winner is not None
    assert choice.winner.name == "b"
    assert [r.name for r in choice.losers] == ["a"]


def test_same_age_breaks_ties_by_name_not_by_input_order() -> None:
    one = choose_policy([_ref("z", "t"), _ref("a", "t")])
    two = choose_policy([_ref("a", "t"), _ref("z", "t")])
    assert one == two
    assert one.winner is not None
    assert one.winner.name == "a"


def test_without_a_policy_the_sidecar_defaults_apply() -> None:
    config = render_fairness_config(_md(), None)
    assert config.source == "default"
    assert config.policy is PolicyName.VTC  # mistral-7b sets sidecar.policy: vtc
    assert config.token_weights.output == 2.0  # VTC paper's w_q


def test_fairserve_policy_renders_stage_expectations_and_weights() -> None:
    spec = TenantPolicySpec.model_validate(example("TenantPolicy", "agents")["spec"])
    config = render_fairness_config(_md(), PolicyRef("llm-serving", "agents", "t", True, spec))
    assert config.source == "TenantPolicy llm-serving/agents"
    assert config.policy is PolicyName.WSC
    assert (
        config.token_weights.input,
        config.token_weights.system,
        config.token_weights.output,
    ) == (1, 2, 1)
    assert config.applications["code-assistant"].stages["edit"].input == 2500
    assert config.interaction_throttling is True
    assert config.tenants["team-search"].priority_factor == 0.8
    assert config.tiers[Tier.IW_FAST].ttft_s == 1.0


def test_version_is_a_content_hash() -> None:
    md = _md()
    assert render_fairness_config(md, None).version == render_fairness_config(md, None).version
    other = md.model_copy(
        update={"sidecar": md.sidecar.model_copy(update={"tenant_header": "x-t"})}
    )
    assert render_fairness_config(other, None).version != render_fairness_config(md, None).version


def test_document_round_trips_and_ignores_a_forged_version() -> None:
    config = render_fairness_config(_md(), None)
    document = config.to_document().replace(config.version, "0000000000000000")
    assert FairnessConfig.from_document(document) == config


def test_ordering_defaults_by_policy_and_an_explicit_choice_wins() -> None:
    drr = render_fairness_config(
        _md(), _ref("p", "t", spec=TenantPolicySpec(policy=PolicyName.DRR))
    )
    assert drr.ordering is Ordering.PRIORITY  # tiered DRR: priority, then deadline, then arrival
    vtc = render_fairness_config(
        _md(), _ref("p", "t", spec=TenantPolicySpec(policy=PolicyName.VTC))
    )
    assert vtc.ordering is Ordering.FIFO
    chosen = TenantPolicySpec(policy=PolicyName.DRR, ordering=Ordering.FIFO)
    assert render_fairness_config(_md(), _ref("p", "t", spec=chosen)).ordering is Ordering.FIFO


def test_an_invalid_selecting_policy_still_wins_so_nothing_falls_back_to_defaults() -> None:
    """Skipping it would hand its ModelDeployments to a younger policy (or the defaults) because
    of a typo; the reconciler keeps the applied config instead."""
    broken = PolicyRef("ns", "old", "2026-01-01", True, None, "invalid spec: drr: ...")
    choice = choose_policy([_ref("young", "2026-01-02"), broken])
    assert choice.winner is broken
    assert [r.name for r in choice.losers] == ["young"]
