"""A TenantPolicy's reconcile and its pod counts cost what the policy selects, not the fleet.

`_selection` resolved the winning policy (every policy of the namespace matched) for every
ModelDeployment of the namespace, before checking whether this policy selects it: 0.9 s per
reconcile at 2,000 ModelDeployments x 200 policies. And every pod change of a ModelDeployment
asked every TenantPolicy of its namespace to reconcile, though only the winning policy counts
its pods. Work is counted (resolutions, requests), not timed; the results are compared with the
old computation on seeded random fleets.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from functools import cache
from typing import Any, cast

import pytest

import fleetwarden.operator.runtime as runtime_module
from fleetwarden.operator.config_push import SIDECAR_CONTAINER, DesiredConfig
from fleetwarden.operator.fairness_render import PolicyRef, choose_policy
from fleetwarden.operator.fleet import FleetView, ObjectRecord
from fleetwarden.operator.kube import ResourceKind
from fleetwarden.operator.naming import MODEL_DEPLOYMENT_LABEL
from fleetwarden.operator.reconcilers.context import Context
from fleetwarden.operator.reconcilers.tenantpolicy import _selection
from fleetwarden.operator.runtime import Runtime
from tests.operator.fixtures import example, record

NS = "llm-serving"
LABEL = "fleetwarden.dev/fairness"


def _old_selection(view: FleetView, policy: ObjectRecord) -> tuple[list[str], list[str]]:
    """`_selection` as it was: the winner resolved for every ModelDeployment of the namespace."""
    applied, lost = [], []
    for md in view.model_deployments_in(policy.namespace):
        refs = view.policy_refs(md.namespace, md.labels)
        mine = next((r for r in refs if r.name == policy.name), None)
        if mine is None or not mine.labels_selected:
            continue
        choice = choose_policy(refs)
        if choice.winner is not None and choice.winner.name == policy.name:
            applied.append(md.name)
        else:
            lost.append(md.name)
    return applied, lost


@cache
def _example(kind: str, name: str) -> dict[str, Any]:
    return example(kind, name)


def _md(name: str, labels: dict[str, str], namespace: str = NS) -> ObjectRecord:
    body = copy.deepcopy(_example("ModelDeployment", "llama-3-70b"))
    body["metadata"].update({"name": name, "namespace": namespace, "labels": labels})
    return record(body)


def _policy(
    name: str, selector: Any, minute: int, namespace: str = NS, valid: bool = True
) -> ObjectRecord:
    body = copy.deepcopy(_example("TenantPolicy", "enterprise"))
    body["metadata"].update({"name": name, "namespace": namespace})
    body["spec"]["selector"] = copy.deepcopy(selector)
    if not valid:
        body["spec"]["policy"] = "no-such-policy"  # invalid elsewhere than in the selector
    return record(body, created=f"2026-01-01T00:{minute:02d}:00Z")


def _random_fleet(rng: random.Random) -> FleetView:
    values = ["a", "b", "c"]
    mds = [
        _md(
            f"md-{i:03d}",
            {k: rng.choice(values) for k in ("team", "tier", LABEL) if rng.random() < 0.7},
            namespace=rng.choice([NS, NS, "other"]),
        )
        for i in range(60)
    ]
    policies = []
    for j in range(12):
        kind = rng.random()
        if kind < 0.5:
            selector: Any = {"matchLabels": {rng.choice(["team", LABEL]): rng.choice(values)}}
        elif kind < 0.8:
            operator = rng.choice(["In", "NotIn", "Exists", "DoesNotExist"])
            values_of = [] if operator in ("Exists", "DoesNotExist") else rng.sample(values, 2)
            selector = {
                "matchExpressions": [{"key": "tier", "operator": operator, "values": values_of}]
            }
        elif kind < 0.9:
            selector = {}  # selects every ModelDeployment of its namespace
        else:
            selector = {"matchLabels": "not a map"}  # invalid: counts as selecting everything
        policies.append(
            _policy(
                f"tp-{j:02d}",
                selector,
                minute=rng.randrange(5),  # ties: broken by name
                namespace=rng.choice([NS, NS, "other"]),
                valid=rng.random() < 0.8,
            )
        )
    return FleetView.of(model_deployments=mds, tenant_policies=policies)


@pytest.mark.parametrize("seed", range(25))
def test_the_selection_equals_the_old_computation_on_random_fleets(seed: int) -> None:
    view = _random_fleet(random.Random(seed))
    for policy in view.tenant_policies.values():
        assert _selection(view, policy) == _old_selection(view, policy), policy.key
    stranger = _policy("not-in-the-view", {}, minute=0)
    assert _selection(view, stranger) == _old_selection(view, stranger) == ([], [])


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Calls of `FleetView.policy_refs` (one per winner resolved), by ModelDeployment name."""
    calls: Counter[str] = Counter()
    original = FleetView.policy_refs

    def counting(self: FleetView, namespace: str | None, labels: Any) -> list[PolicyRef]:
        calls[labels.get("name", "?")] += 1
        return original(self, namespace, labels)

    monkeypatch.setattr(FleetView, "policy_refs", counting)
    return calls


def test_a_reconcile_resolves_only_the_model_deployments_the_policy_selects(
    resolutions: Counter[str],
) -> None:
    """400 ModelDeployments, 40 policies each selecting 10: one reconcile resolves 10 winners
    (it resolved 400, each matching all 40 selectors)."""
    mds = [_md(f"md-{i:03d}", {LABEL: f"tp-{i % 40}", "name": f"md-{i:03d}"}) for i in range(400)]
    policies = [
        _policy(f"tp-{j}", {"matchLabels": {LABEL: f"tp-{j}"}}, minute=j % 60) for j in range(40)
    ]
    view = FleetView.of(model_deployments=mds, tenant_policies=policies)
    applied, lost = _selection(view, view.tenant_policies[f"{NS}/tp-7"])
    assert applied == [f"md-{i:03d}" for i in range(7, 400, 40)]
    assert lost == []
    assert sum(resolutions.values()) == 10
    assert set(resolutions) == set(applied)


# -- pod changes reach only the policy that counts them ------------------------------------------


def _pod(md: str, index: int, ready: bool) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": NS,
            "name": f"{md}-pod-{index}",
            "labels": {MODEL_DEPLOYMENT_LABEL: md},
        },
        "spec": {
            "containers": [
                {"name": SIDECAR_CONTAINER, "ports": [{"name": "http", "containerPort": 1}]}
            ]
        },
        "status": {
            "podIP": f"10.0.0.{index}",
            "conditions": [{"type": "Ready", "status": str(ready)}],
        },
    }


class _Fleet:
    """A runtime over a mutable fleet, its reconciles stubbed (no API): what is requested."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, view: FleetView) -> None:
        self.view = view
        context = Context(
            kube=cast(Any, None), events=cast(Any, None), sidecar_image="x", now=lambda: "t"
        )
        self.runtime = Runtime(context)
        self.requested: Counter[str] = Counter()
        self.runtime.policies.request = self._request  # type: ignore[method-assign]
        self.runtime.pools.request = lambda key: None  # type: ignore[method-assign]
        self.runtime.model_deployments.request = lambda key: None  # type: ignore[method-assign]
        self.runtime.view = lambda: self.view  # type: ignore[method-assign]

        async def fresh_view(kind: ResourceKind, key: str) -> FleetView:
            return self.view

        async def no_reconcile(*args: object) -> None:
            return None

        self.runtime.fresh_view = fresh_view  # type: ignore[method-assign]
        monkeypatch.setattr(runtime_module, "reconcile_model_deployment", no_reconcile)

    def _request(self, key: str) -> None:
        self.requested[key] += 1

    async def reconcile(self, key: str) -> None:
        await self.runtime._reconcile_model_deployment(key)


def _policies(*selected: tuple[str, str]) -> list[ObjectRecord]:
    """One policy per (name, label value) it selects; the first listed is the oldest."""
    return [
        _policy(name, {"matchLabels": {LABEL: value}}, minute=i)
        for i, (name, value) in enumerate(selected)
    ]


async def test_a_rollout_requests_only_the_policy_that_counts_the_pods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five policies, four ModelDeployments; a rollout of `md-0`'s pods (new ones created, ready,
    acknowledged, old ones gone) asks for `gold` only, the policy `md-0`'s counts belong to
    (before, each of the 24 pod changes asked for every policy of the namespace)."""
    mds = [_md(f"md-{i}", {LABEL: ["gold", "silver", "bronze", "none"][i]}) for i in range(4)]
    policies = _policies(
        ("gold", "gold"), ("silver", "silver"), ("bronze", "bronze"), ("tin", "tin"), ("x", "x")
    )
    fleet = _Fleet(monkeypatch, FleetView.of(model_deployments=mds, tenant_policies=policies))
    for md in mds:
        await fleet.reconcile(md.key)
    fleet.requested.clear()

    pusher = fleet.runtime.context.pusher
    monkeypatch.setattr(pusher, "_schedule", lambda key: None)  # no pushes: no event loop work
    key = f"{NS}/md-0"
    pusher.set_desired(key, DesiredConfig("v1", "{}", "token"))
    old = [_pod("md-0", i, ready=True) for i in range(4)]
    pusher.sync_pods(key, old)
    for i in range(4, 8):
        pusher.sync_pods(key, [*old, _pod("md-0", i, ready=False)])
        pusher.sync_pods(key, [*old, _pod("md-0", i, ready=True)])
    new = [_pod("md-0", i, ready=True) for i in range(4, 8)]
    for pod in new:
        pusher.acknowledged[f"{NS}/{pod['metadata']['name']}"] = "v1"
        pusher.on_change(key)  # as `_push_until_acknowledged` does on an acknowledgement
    pusher.sync_pods(key, new)  # the old pods are gone

    assert pusher.counts(key) == (4, 4)
    assert set(fleet.requested) == {f"{NS}/gold"}
    assert fleet.requested[f"{NS}/gold"] >= 8


async def test_a_model_deployment_that_changes_policy_tells_both_and_then_only_the_new(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`md-0` moves from `gold` to `silver` (gold's selector no longer matches it, an older
    policy appears, or it loses its labels): its next reconcile asks for the policy that lost
    it (its count drops) and the one that won it, and later pod changes reach the new one only.
    A ModelDeployment no policy selects asks for none."""
    mds = [_md("md-0", {LABEL: "gold"}), _md("md-1", {LABEL: "silver"})]
    gold, silver, other = _policies(("gold", "gold"), ("silver", "silver"), ("other", "other"))
    fleet = _Fleet(
        monkeypatch, FleetView.of(model_deployments=mds, tenant_policies=[gold, silver, other])
    )
    for md in mds:
        await fleet.reconcile(md.key)
    key = f"{NS}/md-0"
    fleet.requested.clear()
    fleet.runtime.context.pusher.on_change(key)
    assert set(fleet.requested) == {f"{NS}/gold"}

    # gold's selector moves away from md-0; silver now selects it too.
    gold = _policy("gold", {"matchLabels": {LABEL: "platinum"}}, minute=0)
    silver = _policy("silver", {"matchExpressions": [{"key": LABEL, "operator": "Exists"}]}, 1)
    fleet.view = FleetView.of(model_deployments=mds, tenant_policies=[gold, silver, other])
    fleet.requested.clear()
    await fleet.reconcile(key)
    assert set(fleet.requested) == {f"{NS}/gold", f"{NS}/silver"}
    fleet.requested.clear()
    await fleet.reconcile(key)  # nothing moved: nothing asked
    fleet.runtime.context.pusher.on_change(key)
    assert set(fleet.requested) == {f"{NS}/silver"}

    # An older policy takes md-0 over; then md-0 loses its labels and no policy selects it.
    oldest = _policy("oldest", {"matchLabels": {LABEL: "gold"}}, minute=0)
    fleet.view = FleetView.of(model_deployments=mds, tenant_policies=[gold, silver, oldest])
    fleet.requested.clear()
    await fleet.reconcile(key)
    assert set(fleet.requested) == {f"{NS}/silver", f"{NS}/oldest"}
    bare = _md("md-0", {})
    fleet.view = FleetView.of(
        model_deployments=[bare, mds[1]], tenant_policies=[gold, silver, oldest]
    )
    fleet.requested.clear()
    await fleet.reconcile(key)
    assert f"{NS}/oldest" in fleet.requested  # (new labels: `_fan_out` asks the namespace's)
    fleet.requested.clear()
    fleet.runtime.context.pusher.on_change(key)
    assert not fleet.requested  # no policy counts md-0 now
