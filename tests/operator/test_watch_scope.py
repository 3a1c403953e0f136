"""The operator watches only its own Deployments, Services and ConfigMaps, selected server-side.

Without a server-side selector Kopf lists and watches every object of these kinds in the cluster
and drops all but the operator's own in memory: cost that grows with everyone else's workloads.
Real: Kopf, the operator's registry and startup. Mocked: the cluster (the API emulator, which
filters by label selector and records each request's query string like an audit log would).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import kopf
import pytest
from kopf._cogs.structs.references import Resource

from fleetwarden.operator import builders, naming
from fleetwarden.operator.handlers.children import CHILD_KINDS, WATCH_SELECTOR
from fleetwarden.operator.main import _configure_kopf
from fleetwarden.operator.spot_deployments import build_spot_deployment, build_spot_service
from tests.operator.fixtures import region_target
from tests.support.fleet_operator import RunningOperator, example_objects, running_operator
from tests.support.kube_emulator import KubeEmulator
from tests.support.kube_selectors import parse_label_selector

NS = "llm-serving"
pytestmark = pytest.mark.timeout(120)
CHILD_PLURALS = {plural for _, _, plural in CHILD_KINDS}


def _resource(group: str, version: str, plural: str) -> Resource:
    return Resource(group=group, version=version, plural=plural, namespaced=True)


def test_startup_settings_select_the_operators_label_for_each_child_kind() -> None:
    settings = kopf.OperatorSettings()
    _configure_kopf(settings)
    for group, version, plural in CHILD_KINDS:
        assert settings.watching.label_selectors.collect(_resource(group, version, plural)) == [
            f"{naming.MANAGED_BY}={naming.MANAGER}"
        ]
    # The operator's own kinds are watched whole: users' objects carry no label of ours.
    own = _resource("fleetwarden.dev", "v1alpha1", "modeldeployments")
    assert settings.watching.label_selectors.collect(own) == []
    # Same-named kinds of other groups are not narrowed by accident.
    assert (
        settings.watching.label_selectors.collect(_resource("example.dev", "v1", "services")) == []
    )


def test_every_object_the_operator_creates_matches_the_watch_selector() -> None:
    """A child the selector missed would never wake its owner: drift would go uncorrected."""
    target = region_target()
    created = [
        *builders.build_children(target),
        build_spot_deployment(target, 1),
        build_spot_service(target),
    ]
    selected = parse_label_selector(WATCH_SELECTOR)
    for obj in created:
        assert selected(obj), (obj["kind"], obj["metadata"]["name"])


@pytest.fixture
async def fleet() -> AsyncIterator[RunningOperator]:
    """The operator with examples/ applied and settled, next to objects that are not ours."""
    async with KubeEmulator() as emulator, running_operator(emulator) as op:
        for kind, api_version in (("ConfigMap", "v1"), ("Service", "v1")):
            emulator.create(
                {"apiVersion": api_version, "kind": kind, "metadata": {"name": "not-ours"}},
                namespace=NS,
            )
        await op.apply(o for o in example_objects() if o["kind"] != "Namespace")
        await op.settle()
        yield op


async def test_child_lists_and_watches_ask_the_server_for_our_label_only(
    fleet: RunningOperator,
) -> None:
    emulator = fleet.emulator
    watches = [w for w in emulator.active_watches if w.plural in CHILD_PLURALS]
    assert {w.plural for w in watches} == CHILD_PLURALS
    assert {w.label_selector for w in watches} == {WATCH_SELECTOR}
    # Every collection read of these kinds (Kopf's initial lists and watches, and the
    # operator's own lists of a ModelDeployment's children) carries the selector.
    collection_reads = [
        r
        for r in emulator.requests
        if r.method == "GET" and r.path.rsplit("/", 1)[-1] in CHILD_PLURALS
    ]
    assert len(collection_reads) >= 2 * len(CHILD_PLURALS)  # a list and a watch per kind
    for request in collection_reads:
        terms = request.query.get("labelSelector", "").split(",")
        assert WATCH_SELECTOR in terms, (request.path, dict(request.query))


async def test_a_child_stripped_of_the_label_is_relabelled(fleet: RunningOperator) -> None:
    """The server reports a child that stops matching the selector as DELETED; that wakes its
    owner, whose reconcile puts the label back (a watch filtered only client-side dropped it)."""
    name = "mistral-7b-us-east-a100"
    for kind in ("Deployment", "Service"):
        child = fleet.get(kind, name, NS)
        assert child is not None
        await fleet.patch(child, {"metadata": {"labels": {naming.MANAGED_BY: None}}})
    await fleet.settle()
    for kind in ("Deployment", "Service"):
        child = fleet.get(kind, name, NS)
        assert child is not None
        assert child["metadata"]["labels"][naming.MANAGED_BY] == naming.MANAGER, kind
