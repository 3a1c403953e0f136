"""The operator's RBAC, derived from what the operator's code creates, rendered by real Helm.

test_chart.py pins each rule of the cluster-wide ClusterRole. These tests derive what must be
granted from the operator itself (the objects its builders make), so that a new owner kind cannot
lose a permission, and they check the watchNamespaces mode, where the rights on namespaced objects
are granted by a Role in each watched namespace instead of cluster-wide.

The API emulator does not enforce RBAC, which is why these checks run on the rendered chart.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from fleetwarden.operator import builders
from fleetwarden.operator.sidecar_secret import SidecarSecret, build_sidecar_secret
from fleetwarden.operator.spot_deployments import build_spot_deployment, build_spot_service
from tests.operator.fixtures import region_target
from tests.support.helm_render import (
    CHART_DIR,
    DEFAULT_NAMESPACE,
    find_object,
    objects_of_kind,
    render_chart,
)
from tests.support.kube_resources import builtin_resources

FULLNAME = "fleetwarden"
WATCHED = ("team-a", "team-b")
Rules = dict[tuple[str, str], set[str]]


def _rules(role: dict[str, Any]) -> Rules:
    """{(apiGroup, resource): verbs}; a resource granted by two rules gets the union."""
    flat: Rules = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                flat.setdefault((group, resource), set()).update(rule["verbs"])
    return flat


def _shipped_crds() -> list[dict[str, Any]]:
    return [
        yaml.safe_load(path.read_text(encoding="utf-8"))
        for path in sorted((CHART_DIR / "files" / "crds").glob("*.yaml"))
    ]


def _plural(api_version: str, kind: str) -> tuple[str, str]:
    """(group, plural) of a kind, from the shipped CRDs or the built-in kinds."""
    group = api_version.rpartition("/")[0]
    for crd in _shipped_crds():
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind:
            return group, crd["spec"]["names"]["plural"]
    for rt in builtin_resources():
        if rt.group == group and rt.kind == kind:
            return group, rt.plural
    raise LookupError(f"unknown kind {api_version} {kind}")


def _cluster_scoped(group: str, resource: str) -> bool:
    plural = resource.partition("/")[0]
    for crd in _shipped_crds():
        if (crd["spec"]["group"], crd["spec"]["names"]["plural"]) == (group, plural):
            return bool(crd["spec"]["scope"] == "Cluster")
    for rt in builtin_resources():
        if (rt.group, rt.plural) == (group, plural):
            return not rt.namespaced
    raise LookupError(f"unknown resource {group}/{resource}")


def created_by_the_operator() -> list[dict[str, Any]]:
    """Every kind of object the operator creates, as its own builders make them."""
    target = region_target()
    return [
        *builders.build_children(target),
        build_spot_deployment(target, 1),
        build_spot_service(target),
        build_sidecar_secret(target.owner, SidecarSecret("admin", "key")),
    ]


def blocking_owners() -> set[tuple[str, str]]:
    """(group, plural) of every owner the operator's children block the deletion of."""
    owners = {
        _plural(ref["apiVersion"], ref["kind"])
        for obj in created_by_the_operator()
        for ref in obj["metadata"].get("ownerReferences") or []
        if ref.get("blockOwnerDeletion")
    }
    assert owners, "the children are expected to block their owner's deletion"
    return owners


@pytest.fixture(scope="module")
def cluster_wide() -> list[dict[str, Any]]:
    return render_chart()


@pytest.fixture(scope="module")
def namespaced() -> list[dict[str, Any]]:
    return render_chart({"watchNamespaces": list(WATCHED)})


def _namespaced_role(objects: list[dict[str, Any]], namespace: str) -> dict[str, Any]:
    [role] = [
        r
        for r in objects_of_kind(objects, "Role")
        if r["metadata"]["namespace"] == namespace and r["metadata"]["name"] == FULLNAME
    ]
    return role


# --- blockOwnerDeletion needs the owners' finalizers -------------------------------------------


def test_owner_finalizers_are_granted_where_children_are_created(
    cluster_wide: list[dict[str, Any]], namespaced: list[dict[str, Any]]
) -> None:
    """With OwnerReferencesPermissionEnforcement (on in OpenShift), creating an object whose
    owner reference sets blockOwnerDeletion needs `update` on the owner's finalizers: without it
    every child create is refused with 403."""
    wanted = {(group, f"{plural}/finalizers") for group, plural in blocking_owners()}
    granted = _rules(find_object(cluster_wide, "ClusterRole", FULLNAME))
    for key in wanted:
        assert "update" in granted.get(key, set()), key
    for namespace in WATCHED:
        granted = _rules(_namespaced_role(namespaced, namespace))
        for key in wanted:
            assert "update" in granted.get(key, set()), (namespace, key)


def test_the_operator_may_create_every_kind_it_builds(
    cluster_wide: list[dict[str, Any]], namespaced: list[dict[str, Any]]
) -> None:
    kinds = {_plural(obj["apiVersion"], obj["kind"]) for obj in created_by_the_operator()}
    granted = _rules(find_object(cluster_wide, "ClusterRole", FULLNAME))
    assert all("create" in granted.get(kind, set()) for kind in kinds), kinds
    for namespace in WATCHED:
        granted = _rules(_namespaced_role(namespaced, namespace))
        assert all("create" in granted.get(kind, set()) for kind in kinds), namespace


# --- watchNamespaces: namespaced rights only in the watched namespaces --------------------------


def test_watched_namespaces_get_the_namespaced_rules_and_nothing_else_does(
    cluster_wide: list[dict[str, Any]], namespaced: list[dict[str, Any]]
) -> None:
    everywhere = _rules(find_object(cluster_wide, "ClusterRole", FULLNAME))
    cluster_role = _rules(find_object(namespaced, "ClusterRole", FULLNAME))
    # Nothing namespaced stays in the ClusterRole: it would apply in every namespace.
    assert all(_cluster_scoped(*key) for key in cluster_role), sorted(cluster_role)
    # Cluster-wide mode's namespaced rules, each now in every watched namespace's Role.
    namespaced_rules = {k: v for k, v in everywhere.items() if not _cluster_scoped(*k)}
    for namespace in WATCHED:
        assert _rules(_namespaced_role(namespaced, namespace)) == namespaced_rules, namespace
    # Cluster-scoped needs unchanged, except the ClusterKopfPeering: a namespaced Kopf elects
    # its active replica through a KopfPeering in each watched namespace instead.
    cluster_rules = {k: v for k, v in everywhere.items() if _cluster_scoped(*k)}
    assert cluster_role == {
        k: v for k, v in cluster_rules.items() if k != ("kopf.dev", "clusterkopfpeerings")
    }


def test_each_role_is_bound_to_the_operator_service_account(
    namespaced: list[dict[str, Any]],
) -> None:
    roles = {
        (r["metadata"]["namespace"], r["metadata"]["name"])
        for r in objects_of_kind(namespaced, "Role")
    }
    bindings = objects_of_kind(namespaced, "RoleBinding")
    assert {(b["metadata"]["namespace"], b["metadata"]["name"]) for b in bindings} == roles
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": binding["metadata"]["name"],
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": FULLNAME, "namespace": DEFAULT_NAMESPACE}
        ]
    # The ClusterRoleBinding stays, now for the cluster-scoped rules only.
    assert find_object(namespaced, "ClusterRoleBinding", FULLNAME)["roleRef"]["kind"] == (
        "ClusterRole"
    )


def test_events_of_cluster_scoped_objects_may_go_to_the_operators_namespace(
    namespaced: list[dict[str, Any]],
) -> None:
    """Kopf posts the Events of a RegionPool (cluster-scoped) into its own namespace."""
    roles = {
        (r["metadata"]["namespace"], r["metadata"]["name"]): r
        for r in objects_of_kind(namespaced, "Role")
    }
    assert set(roles) == {(ns, FULLNAME) for ns in WATCHED} | {
        (DEFAULT_NAMESPACE, f"{FULLNAME}-events")
    }
    assert _rules(roles[DEFAULT_NAMESPACE, f"{FULLNAME}-events"]) == {("", "events"): {"create"}}
    # Watching its own namespace already grants it there: no second Role.
    watching_own = render_chart({"watchNamespaces": [DEFAULT_NAMESPACE, "team-a"]})
    names = {
        (r["metadata"]["namespace"], r["metadata"]["name"])
        for r in objects_of_kind(watching_own, "Role")
    }
    assert names == {(DEFAULT_NAMESPACE, FULLNAME), ("team-a", FULLNAME)}


def test_cluster_wide_mode_needs_no_roles(cluster_wide: list[dict[str, Any]]) -> None:
    assert objects_of_kind(cluster_wide, "Role") == []
    assert objects_of_kind(cluster_wide, "RoleBinding") == []
