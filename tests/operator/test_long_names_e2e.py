"""Long ModelDeployment names end to end: the real operator on the API emulator.

Two ModelDeployments whose names share their first 63 characters used to get the same
`fleetwarden.dev/model-deployment` value: each one's Services selected the other's pods, and
the config pusher counted every pod for whichever reconciled last. And a Deployment made by
that earlier operator holds the old value in its selector, which the API server refuses to change
(422): the operator must keep it working, never send a changed selector, and say how to migrate.

No controller-manager runs here, so the tests create what it would: a ReplicaSet per Deployment
(`<deployment>-<pod-template-hash>`, owned by it) and a ready pod owned by that ReplicaSet.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec, RegionPoolSpec
from fleetwarden.operator import builders, naming
from fleetwarden.operator.fairness_render import render_fairness_config
from fleetwarden.operator.kube import DEPLOYMENTS, MODEL_DEPLOYMENTS, PODS
from fleetwarden.operator.main import OperatorSettings
from fleetwarden.operator.spot_deployments import (
    build_spot_deployment,
    build_spot_service,
    spot_name,
)
from tests.operator.test_operator_e2e import condition, example
from tests.support.fleet_operator import RunningOperator, running_operator
from tests.support.kube_emulator import KubeEmulator
from tests.support.sidecar_stack import free_port

NS = "llm-serving"
PREFIX = "llama-" + "x" * 57  # 63 characters
ONE, TWO = f"{PREFIX}-one", f"{PREFIX}-two"
TEMPLATE_HASH = "5d8f7"
POOL = "us-west-a100"  # spot enabled, as llama-3-70b's niw.spot
LEGACY_SELECTOR = "LegacySelector"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def op() -> AsyncIterator[RunningOperator]:
    async with KubeEmulator() as emulator, running_operator(emulator) as running:
        yield running


def model(name: str, served: str, port: int) -> dict[str, Any]:
    body = example("ModelDeployment", "mistral-7b")
    body["metadata"]["name"] = name
    body["spec"]["model"]["servedName"] = served
    body["spec"].setdefault("sidecar", {})["port"] = (
        port  # nothing listens: pushes fail and are retried
    )
    return body


def owned(op: RunningOperator, kind: str, uid: str) -> list[dict[str, Any]]:
    return [
        obj
        for obj in op.list(kind, NS)
        if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])
    ]


def uid_of(op: RunningOperator, name: str) -> str:
    md = op.get("ModelDeployment", name, NS)
    assert md is not None
    return str(md["metadata"]["uid"])


async def run_pod(op: RunningOperator, deployment: dict[str, Any], pod: str, ip: str) -> None:
    """What the Deployment controller and a kubelet would do: a ReplicaSet, a ready pod."""
    metadata, spec = deployment["metadata"], deployment["spec"]
    labels = {**spec["template"]["metadata"]["labels"], "pod-template-hash": TEMPLATE_HASH}
    replica_set = op.emulator.create(
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": f"{metadata['name']}-{TEMPLATE_HASH}",
                "namespace": NS,
                "labels": labels,
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": metadata["name"],
                        "uid": metadata["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {**spec["template"], "metadata": {"labels": labels}},
            },
        }
    )
    op.emulator.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod,
                "namespace": NS,
                "labels": labels,
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": replica_set["metadata"]["name"],
                        "uid": replica_set["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": spec["template"]["spec"],
        }
    )
    status = {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}
    await op.kube.patch_status(PODS, pod, status, NS)


async def poke(op: RunningOperator, name: str, value: str) -> None:
    """A label change: the ModelDeployment is reconciled (and lists its pods) again."""
    patch = {"metadata": {"labels": {"poke": value}}}
    await op.kube.merge_patch(MODEL_DEPLOYMENTS, name, patch, NS)
    await op.settle()


def pods_of(op: RunningOperator, name: str) -> set[str]:
    pusher = op.runtime.context.pusher
    return {key for key, pod in pusher.pods.items() if pod.model_deployment == f"{NS}/{name}"}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


async def test_names_sharing_63_characters_never_share_pods_or_children(
    op: RunningOperator,
) -> None:
    port = free_port()
    await op.apply([example("RegionPool", "us-east-a100"), example("RegionPool", "eu-west-h100")])
    await op.apply([model(ONE, "one", port), model(TWO, "two", port)])
    await op.settle()
    uids = {name: uid_of(op, name) for name in (ONE, TWO)}
    deployments = {name: owned(op, "Deployment", uids[name]) for name in (ONE, TWO)}

    for name, other in ((ONE, TWO), (TWO, ONE)):
        assert len(deployments[name]) == 2
        for deployment in deployments[name]:
            selector = deployment["spec"]["selector"]["matchLabels"]
            assert selector[naming.MODEL_DEPLOYMENT_LABEL] == naming.label_value(name)
            service = op.get("Service", deployment["metadata"]["name"], NS)
            assert service is not None
            assert service["spec"]["selector"] == selector
            for theirs in deployments[other]:  # no Service sends traffic to the other's pods
                assert not selects(selector, theirs["spec"]["template"]["metadata"]["labels"])

    expected: dict[str, set[str]] = {ONE: set(), TWO: set()}
    for index, deployment in enumerate(deployments[ONE] + deployments[TWO]):
        name = ONE if index < 2 else TWO
        await run_pod(op, deployment, f"pod-{index}", f"127.0.0.{10 + index}")
        expected[name].add(f"{NS}/pod-{index}")
    await poke(op, ONE, "1")
    await poke(op, TWO, "1")
    pusher = op.runtime.context.pusher
    for name in (ONE, TWO):
        assert pods_of(op, name) == expected[name]
        assert pusher.counts(f"{NS}/{name}")[1] == 2  # ready pods: its own two, not four

    # ONE leaves eu-west: its children there go, TWO's (same pool, same old value) stay.
    one = model(ONE, "one", port)
    one["spec"]["regions"] = [r for r in one["spec"]["regions"] if r["pool"] == "us-east-a100"]
    await op.patch(one, {"spec": {"regions": one["spec"]["regions"]}})
    await op.settle()
    for kind in ("Deployment", "Service", "ConfigMap"):
        assert len(owned(op, kind, uids[ONE])) == 1, kind
        assert len(owned(op, kind, uids[TWO])) == 2, kind
    assert pusher.counts(f"{NS}/{ONE}")[1] == 1
    assert pusher.counts(f"{NS}/{TWO}")[1] == 2
    for name in (ONE, TWO):
        assert condition(op.get("ModelDeployment", name, NS), "Degraded")["status"] == "False"


def _legacy(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as the operator before unique label values wrote it: the cut name in its labels."""
    text = json.dumps(obj)
    for name in (ONE, TWO):
        text = text.replace(f'"{naming.label_value(name)}"', f'"{PREFIX}"')
    result: dict[str, Any] = json.loads(text)
    return result


def _legacy_children(llama: dict[str, Any], uid: str) -> list[dict[str, Any]]:
    """The children an earlier operator made for `llama` in its pool, spot ones included."""
    spec = ModelDeploymentSpec.model_validate(llama["spec"])
    config = render_fairness_config(spec, None)
    target = builders.RegionTarget(
        owner=builders.Owner(name=llama["metadata"]["name"], namespace=NS, uid=uid),
        spec=spec,
        placement=spec.regions[0],
        pool=RegionPoolSpec.model_validate(example("RegionPool", POOL)["spec"]),
        replicas=1,
        sidecar_image=OperatorSettings().sidecar_image,
        config_document=config.to_document(),
        config_version=config.version,
    )
    children = [*builders.build_children(target)]
    children += [build_spot_deployment(target, 1), build_spot_service(target)]
    return [_legacy(child) for child in children]


async def _upgrade_from_legacy(
    op: RunningOperator,
) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
    """ONE and TWO with the children and running pods an earlier operator left (the same old
    label value in their selectors, the same pool), then their pool: the upgraded operator
    reconciles them. Returns each one's Deployment names (serving, spot), and the Deployments
    as they were before."""
    port = free_port()
    names: dict[str, list[str]] = {}
    before: dict[str, dict[str, Any]] = {}
    for name in (ONE, TWO):
        llama = example("ModelDeployment", "llama-3-70b")
        llama["metadata"]["name"] = name
        llama["spec"]["model"]["servedName"] = name[-3:]
        llama["spec"]["regions"] = [{"pool": POOL, "minInstances": 1, "maxInstances": 2}]
        llama["spec"].setdefault("sidecar", {})["port"] = port
        await op.apply([llama])  # its pool does not exist yet: nothing is touched
        await op.settle()
        for child in _legacy_children(llama, uid_of(op, name)):
            await op.kube.create(child)
        names[name] = [naming.child_name(name, POOL), spot_name(name, POOL)]
        for index, deployment_name in enumerate(names[name]):
            deployment = op.get("Deployment", deployment_name, NS)
            assert deployment is not None
            selector = deployment["spec"]["selector"]["matchLabels"]
            assert selector[naming.MODEL_DEPLOYMENT_LABEL] == PREFIX
            before[deployment_name] = deployment
            pod = f"{name[-3:]}-{index}"
            await run_pod(op, deployment, pod, f"127.0.0.{20 + len(before)}")
    await op.apply([example("RegionPool", POOL)])
    await op.settle()
    return names, before


async def test_deployments_from_before_unique_selectors_keep_working(
    op: RunningOperator,
) -> None:
    mark = op.emulator.mark()
    names, legacy = await _upgrade_from_legacy(op)
    for name, before in legacy.items():
        live = op.get("Deployment", name, NS)
        assert live is not None
        kept = before["spec"]["selector"]
        assert live["spec"]["selector"] == kept
        labels = live["spec"]["template"]["metadata"]["labels"]
        assert labels == before["spec"]["template"]["metadata"]["labels"]  # no pod restarts
        service = op.get("Service", name, NS)
        assert service is not None
        assert service["spec"]["selector"] == kept["matchLabels"]  # still selects those pods
        # The emulator does not refuse a changed selector as the API server does (422):
        # so no request may have tried to change it.
        for request in op.emulator.requests[mark:]:
            if request.is_write and request.path.endswith(f"/deployments/{name}"):
                sent = ((request.body or {}).get("spec") or {}).get("selector")
                assert sent in (None, kept), sent
    for name in (ONE, TWO):
        for deployment_name in names[name]:  # found again by the current, unique value
            live = op.get("Deployment", deployment_name, NS)
            assert live is not None
            md_label = live["metadata"]["labels"][naming.MODEL_DEPLOYMENT_LABEL]
            assert md_label == naming.label_value(name)

    # Each one's config goes to its own pods only, and counts them only, though the old
    # label value lists both ones' pods.
    assert pods_of(op, ONE) == {f"{NS}/one-0", f"{NS}/one-1"}
    assert pods_of(op, TWO) == {f"{NS}/two-0", f"{NS}/two-1"}

    md = op.get("ModelDeployment", ONE, NS)
    degraded = condition(md, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", LEGACY_SELECTOR)
    for name in names[ONE]:
        assert f"kubectl delete deployment {name}" in degraded["message"]
    assert "predates unique selectors" in degraded["message"]
    assert condition(md, "Ready")["reason"] != LEGACY_SELECTOR  # it serves as before

    # Settled, and stays so: another reconcile writes nothing (no retried 422, no patch loop).
    quiet = op.emulator.mark()
    await poke(op, ONE, "1")
    writes = [path for _, path in op.emulator.writes_since(quiet)]
    assert writes == [MODEL_DEPLOYMENTS.path(NS, ONE)], writes
    warnings = [e["reason"] for e in op.events_for(ONE, NS) if e["type"] == "Warning"]
    assert warnings.count(LEGACY_SELECTOR) == 1  # once, not on every reconcile

    # Migration as the message says: delete the Deployment; it comes back with a unique selector.
    await op.kube.delete(DEPLOYMENTS, names[ONE][0], NS)
    await op.settle()
    fresh = op.get("Deployment", names[ONE][0], NS)
    assert fresh is not None
    selector = naming.selector_labels(ONE, POOL)
    assert fresh["spec"]["selector"]["matchLabels"] == selector
    service = op.get("Service", names[ONE][0], NS)
    assert service is not None
    assert service["spec"]["selector"] == selector
    degraded = condition(op.get("ModelDeployment", ONE, NS), "Degraded")
    assert names[ONE][0] not in degraded["message"]
    assert names[ONE][1] in degraded["message"]  # the spot Deployment is still the old one
    assert op.get("Deployment", names[TWO][0], NS) is not None  # TWO's is left alone
    assert pods_of(op, TWO) == {f"{NS}/two-0", f"{NS}/two-1"}


async def test_a_child_name_another_model_deployment_holds_is_not_taken_over(
    op: RunningOperator,
) -> None:
    """`m` in pool `x-a100` and `m-x` in pool `a100` both name their children `m-x-a100`: the
    first one's stay its own, the second reports it, and the two never patch them in turn."""
    port = free_port()
    pools = []
    for name in ("x-a100", "a100"):
        pool = example("RegionPool", "us-east-a100")
        pool["metadata"]["name"] = name
        pools.append(pool)
    await op.apply(pools)
    first, second = model("m", "first", port), model("m-x", "second", port)
    first["spec"]["regions"] = [{"pool": "x-a100", "minInstances": 1, "maxInstances": 2}]
    second["spec"]["regions"] = [{"pool": "a100", "minInstances": 1, "maxInstances": 2}]
    await op.apply([first])
    await op.settle()
    await op.apply([second])
    await op.settle()  # a fight over the children would never settle

    uid = uid_of(op, "m")
    for kind, name in (("Deployment", "m-x-a100"), ("Service", "m-x-a100")):
        live = op.get(kind, name, NS)
        assert live is not None
        assert [ref["uid"] for ref in live["metadata"]["ownerReferences"]] == [uid], kind
    deployment = op.get("Deployment", "m-x-a100", NS)
    assert deployment is not None
    assert deployment["spec"]["selector"]["matchLabels"] == naming.selector_labels("m", "x-a100")
    degraded = condition(op.get("ModelDeployment", "m-x", NS), "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ApplyFailed")
    assert "belongs to ModelDeployment m " in degraded["message"]
    assert condition(op.get("ModelDeployment", "m", NS), "Degraded")["status"] == "False"
