"""A ModelDeployment's reconcile resolves its winning TenantPolicy once.

The runtime resolved it (`Runtime._note_policy`, to know which policy counts the pods the
reconcile syncs) and then the reconciler resolved it again from the same view and record, every
policy of the namespace matched twice per reconcile. The runtime now hands its choice over; the
reconciler resolves one only when called without it. Checked against the real operator and the
API emulator: the reconciler resolves none itself, every choice handed over is the one it would
have resolved, and the statuses (winner, conflict) are those it wrote before.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest

import fleetwarden.operator.reconcilers.modeldeployment as reconciler_module
import fleetwarden.operator.runtime as runtime_module
from fleetwarden.operator.accounting_cache import AccountingCache
from fleetwarden.operator.fairness_render import PolicyChoice, PolicyRef, choose_policy
from fleetwarden.operator.fleet import FleetView
from fleetwarden.operator.main import OperatorSettings
from fleetwarden.operator.reconcilers.context import Context
from fleetwarden.operator.served_names import ServedNameIndex
from tests.support.fleet_operator import example_objects, running_operator
from tests.support.kube_emulator import KubeEmulator

NS = "llm-serving"


def _condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    assert obj is not None
    return next(c for c in obj["status"]["conditions"] if c["type"] == kind)


async def test_a_reconcile_resolves_the_winning_policy_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: Counter[str] = Counter()
    handed: list[tuple[PolicyChoice | None, PolicyChoice]] = []

    def counted(where: str) -> Any:
        def choose(candidates: list[PolicyRef]) -> PolicyChoice:
            calls[where] += 1
            return choose_policy(candidates)

        return choose

    monkeypatch.setattr(runtime_module, "choose_policy", counted("runtime"))
    monkeypatch.setattr(reconciler_module, "choose_policy", counted("reconciler"))
    reconcile = reconciler_module.reconcile_model_deployment

    async def watched(
        ctx: Context,
        view: FleetView,
        key: str,
        accounting: AccountingCache | None = None,
        served_names: ServedNameIndex | None = None,
        *rest: Any,
    ) -> None:
        record = view.model_deployments[key]
        again = choose_policy(view.policy_refs(record.namespace, record.labels))
        handed.append((rest[0] if rest else None, again))
        calls["reconciles"] += 1
        await reconcile(ctx, view, key, accounting, served_names, *rest)

    monkeypatch.setattr(runtime_module, "reconcile_model_deployment", watched)

    settings = OperatorSettings(peering_name=None, resync_seconds=3600)
    async with KubeEmulator() as emulator, running_operator(emulator, settings) as op:
        objects = [o for o in example_objects() if o["kind"] != "Namespace"]
        clash = copy.deepcopy(next(o for o in objects if o["metadata"]["name"] == "enterprise"))
        clash["metadata"]["name"] = "enterprise-copy"  # younger: a conflict on llama-3-70b
        await op.apply(objects)
        await op.settle()
        await op.apply([clash])
        await op.settle()

        assert calls["reconciles"] > 0
        assert calls["reconciler"] == 0  # before: one per reconcile of a valid spec
        assert calls["runtime"] == calls["reconciles"]
        assert all(given == again for given, again in handed)
        assert any(again.losers for _, again in handed)

        llama = op.get("ModelDeployment", "llama-3-70b", NS)
        assert llama is not None
        assert llama["status"]["tenantPolicy"] == "enterprise"
        degraded = _condition(llama, "Degraded")
        assert degraded["reason"] == "TenantPolicyConflict"
        assert "enterprise (the oldest) applies" in degraded["message"]
        mistral = op.get("ModelDeployment", "mistral-7b", NS)
        assert mistral is not None
        assert mistral["status"]["tenantPolicy"] == "agents"
