"""The Helm chart, rendered and linted by real Helm (helm-python-sdk), offline.

Each test states why an object looks the way it does: least-privilege RBAC, a restricted-PSS pod,
Kopf's peering/liveness wiring, CRDs that survive `helm uninstall`, and values that cannot be
mistyped. Every rendered object is also validated against the Kubernetes OpenAPI schemas of the
oldest and newest Kubernetes versions we support.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import helm_python
import kubernetes_validate
import pytest
import yaml

from tests.support.helm_render import (
    CHART_DIR,
    DEFAULT_NAMESPACE,
    DEFAULT_RELEASE,
    Severity,
    find_object,
    lint_chart,
    objects_of_kind,
    render_chart,
    render_notes,
    validate_objects,
)

CRD_DIR = CHART_DIR / "files" / "crds"
TEMPLATES_DIR = CHART_DIR / "templates"
FULLNAME = "fleetwarden"  # release "fleetwarden" contains the chart name, so no suffix

#: Oldest supported: the CRDs' CEL rules use messageExpression/reason, fine from 1.30 on.
OLDEST_KUBERNETES = "1.30.0"
#: Newest: whatever the installed kubernetes-validate ships schemas for.
NEWEST_KUBERNETES = kubernetes_validate.latest_version()
KUBERNETES_VERSIONS = (OLDEST_KUBERNETES, NEWEST_KUBERNETES)

#: kubernetes-validate knows only built-in kinds; the CRDs themselves are built-in
#: (apiextensions.k8s.io/v1) and are validated. This is the only custom resource the chart renders.
UNVALIDATED_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}

#: The value sets the chart must support, each rendered once per module.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced": {"watchNamespaces": ["a", "b"]},
    "namespaced-with-own-namespace": {"watchNamespaces": [DEFAULT_NAMESPACE, "a"]},
    "crds-disabled": {"crds": {"enabled": False}},
    "crds-not-kept": {"crds": {"keep": False}},
    "kopf-peering-crds-left-out": {"crds": {"kopfPeering": False, "keep": False}},
    "service-monitor": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "two-replicas": {"replicaCount": 2},
    "custom-service-account": {"serviceAccount": {"name": "fw-operator"}},
    "existing-service-account": {"serviceAccount": {"create": False, "name": "preexisting"}},
    "no-aggregated-roles": {"rbac": {"aggregateToDefaultRoles": False}},
    "passthroughs": {
        "image": {"repository": "registry.example/fw", "tag": "1.2.3", "pullPolicy": "Always"},
        "sidecar": {"image": {"repository": "registry.example/fw-sidecar"}},
        "imagePullSecrets": [{"name": "regcred"}],
        "podAnnotations": {"example.com/team": "ml-platform"},
        "podLabels": {"team": "ml", "app.kubernetes.io/name": "hijacked"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
        "priorityClassName": "system-cluster-critical",
        "resyncSeconds": 15,
        "peering": {"name": "fleetwarden-eu"},
        "prometheus": {
            "url": "http://prometheus.monitoring:9090",
            "intervalSeconds": 30,
            "forecastRefitHours": 24,
        },
    },
}

# The operator's ClusterRole, rule by rule, with the reason each one exists. The chart must grant
# exactly this: anything more is not least privilege, anything less breaks the operator.
FLEETWARDEN_KINDS = ("regionpools", "modeldeployments", "tenantpolicies")
KOPF_PEERINGS = ("clusterkopfpeerings", "kopfpeerings")
EXPECTED_OPERATOR_RULES: dict[tuple[str, str], tuple[set[str], str]] = {
    **{
        ("fleetwarden.dev", plural): (
            {"get", "list", "watch"},
            "watched and indexed; level-based handlers leave no finalizers or annotations",
        )
        for plural in FLEETWARDEN_KINDS
    },
    **{
        ("fleetwarden.dev", f"{plural}/status"): (
            {"get", "patch"},
            "the operator merge-patches progress and conditions into status",
        )
        for plural in FLEETWARDEN_KINDS
    },
    ("apps", "deployments"): (
        {"get", "list", "watch", "create", "patch", "delete"},
        "serving Deployments per ModelDeployment and region, scaled by the operator",
    ),
    ("", "services"): (
        {"get", "list", "watch", "create", "patch", "delete"},
        "Services in front of the serving pods, incl. the sidecar's metrics port",
    ),
    ("", "configmaps"): (
        {"get", "list", "watch", "create", "patch", "delete"},
        "configuration of the serving pods",
    ),
    ("fleetwarden.dev", "modeldeployments/finalizers"): (
        {"update"},
        "children's owner references set blockOwnerDeletion (OwnerReferencesPermissionEnforcement)",
    ),
    ("", "secrets"): (
        {"get", "create"},
        "the sidecars' admin token and interaction key, one Secret per ModelDeployment, by name",
    ),
    ("", "pods"): ({"list"}, "ready serving pods, listed by label, to push fairness configs to"),
    ("", "events"): ({"create"}, "Kopf posts core v1 Events about every action"),
    ("", "namespaces"): ({"get", "list", "watch"}, "Kopf discovers namespaces to watch"),
    ("apiextensions.k8s.io", "customresourcedefinitions"): (
        {"get", "list", "watch"},
        "Kopf discovers which CRDs exist (and the peering CRDs)",
    ),
    **{
        ("kopf.dev", plural): (
            {"get", "list", "watch", "create", "patch"},
            "peering: the operator creates its peering object if missing, then heartbeats into it",
        )
        for plural in KOPF_PEERINGS
    },
}


# --- fixtures and helpers ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """Every value set in VALUE_SETS rendered once (Helm renders in ~40 ms, still worth sharing)."""
    return {name: render_chart(values) for name, values in VALUE_SETS.items()}


@pytest.fixture(scope="module")
def defaults(rendered: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return rendered["defaults"]


def crd_files() -> list[Path]:
    """The CRD files the chart ships; the CRD tests fail loudly rather than pass on nothing."""
    files = sorted(CRD_DIR.glob("*.yaml"))
    if not files:
        pytest.fail(
            f"{CRD_DIR} holds no CRD files. "
            "Generate them with `make crds` (`fleetwarden crds`) before testing the chart."
        )
    return files


def crd_sources() -> dict[str, dict[str, Any]]:
    """The generated CRDs by name, parsed from files/crds/."""
    sources: dict[str, dict[str, Any]] = {}
    for path in crd_files():
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        sources[crd["metadata"]["name"]] = crd
    return sources


def operator_deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return find_object(objects, "Deployment", FULLNAME)


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = operator_deployment(objects)["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    container: dict[str, Any] = containers[0]
    return container


def flag_values(args: list[str], flag: str) -> list[str]:
    """Values given to a repeated `--flag value` option."""
    return [args[i + 1] for i, arg in enumerate(args) if arg == flag]


def rule_set(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """A role's rules flattened to {(apiGroup, resource): verbs}, failing on any duplicate."""
    flat: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "resourceNames" not in rule
        assert "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert (group, resource) not in flat, f"{group}/{resource} granted twice"
                flat[(group, resource)] = set(rule["verbs"])
    return flat


def kinds_and_names(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(obj["kind"], obj["metadata"]["name"]) for obj in objects}


# --- what gets installed -----------------------------------------------------------------------


def test_defaults_install_operator_rbac_and_crds_only(defaults: list[dict[str, Any]]) -> None:
    expected = {
        ("ServiceAccount", FULLNAME),
        ("ClusterRole", FULLNAME),
        ("ClusterRoleBinding", FULLNAME),
        ("ClusterRole", f"{FULLNAME}-editor"),
        ("ClusterRole", f"{FULLNAME}-viewer"),
        ("Deployment", FULLNAME),
    } | {("CustomResourceDefinition", name) for name in crd_sources()}
    # No ServiceMonitor (needs the Prometheus Operator) and no PDB (one replica) by default.
    assert kinds_and_names(defaults) == expected


def test_namespaced_objects_go_to_the_release_namespace(defaults: list[dict[str, Any]]) -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
    for obj in defaults:
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in cluster_scoped:
            assert namespace is None, obj["kind"]
        else:
            assert namespace == DEFAULT_NAMESPACE, obj["kind"]


def test_every_object_carries_the_standard_labels(rendered: dict[str, Any]) -> None:
    for objects in rendered.values():
        for obj in objects:
            labels = obj["metadata"]["labels"]
            assert labels["app.kubernetes.io/instance"] == DEFAULT_RELEASE
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert labels["app.kubernetes.io/version"] == "0.1.0"
            assert labels["helm.sh/chart"] == "fleetwarden-0.1.0"
            assert labels["app.kubernetes.io/name"] == "fleetwarden"


# --- the operator Deployment -------------------------------------------------------------------


def test_image_defaults_to_app_version_and_sidecar_to_operator_image(
    defaults: list[dict[str, Any]],
) -> None:
    container = operator_container(defaults)
    assert container["image"] == "ghcr.io/fleetwarden/fleetwarden:0.1.0"
    assert container["command"] == ["fleetwarden", "operator"]
    # The sidecar is the same package (`fleetwarden sidecar`), so it is the same image.
    assert flag_values(container["args"], "--sidecar-image") == [container["image"]]


def test_image_overrides(rendered: dict[str, Any]) -> None:
    container = operator_container(rendered["passthroughs"])
    assert container["image"] == "registry.example/fw:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    # Only the repository was overridden: the tag follows the operator's.
    assert flag_values(container["args"], "--sidecar-image") == [
        "registry.example/fw-sidecar:1.2.3"
    ]


def test_cluster_wide_by_default(defaults: list[dict[str, Any]]) -> None:
    args = operator_container(defaults)["args"]
    assert "--all-namespaces" in args
    assert "--namespace" not in args


def test_watch_namespaces_become_namespace_flags(rendered: dict[str, Any]) -> None:
    args = operator_container(rendered["namespaced"])["args"]
    assert flag_values(args, "--namespace") == ["a", "b"]
    # Kopf refuses --all-namespaces together with --namespace.
    assert "--all-namespaces" not in args


def test_operator_flags(defaults: list[dict[str, Any]], rendered: dict[str, Any]) -> None:
    args = operator_container(defaults)["args"]
    assert flag_values(args, "--peering") == ["fleetwarden"]
    assert flag_values(args, "--resync-seconds") == ["60"]
    assert all(isinstance(arg, str) for arg in args), "container args must be strings"
    custom = operator_container(rendered["passthroughs"])["args"]
    assert flag_values(custom, "--peering") == ["fleetwarden-eu"]
    assert flag_values(custom, "--resync-seconds") == ["15"]
    assert flag_values(custom, "--forecast-refit-hours") == ["24"]
    assert flag_values(args, "--forecast-refit-hours") == []  # no Prometheus: no planner
    # The real command line accepts what the chart renders (args after the subcommand).
    from fleetwarden.cli import build_parser

    command = operator_container(rendered["passthroughs"])["command"]
    assert command == ["fleetwarden", "operator"]
    parsed = build_parser().parse_args([*command[1:], *custom])
    assert (parsed.prometheus_url, parsed.forecast_refit_hours) == (
        "http://prometheus.monitoring:9090",
        24.0,
    )


def test_probes_hit_the_endpoint_kopf_serves(defaults: list[dict[str, Any]]) -> None:
    container = operator_container(defaults)
    [liveness_url] = flag_values(container["args"], "--liveness")
    endpoint = urlsplit(liveness_url)
    # Kopf must listen on all interfaces, or the kubelet cannot reach it on the pod IP.
    assert endpoint.hostname == "0.0.0.0"
    [port] = container["ports"]
    assert port == {"name": "health", "containerPort": endpoint.port, "protocol": "TCP"}
    for probe in ("livenessProbe", "readinessProbe"):
        http_get = container[probe]["httpGet"]
        assert http_get == {"path": endpoint.path, "port": "health"}, probe


def test_pod_identity_comes_from_the_downward_api(defaults: list[dict[str, Any]]) -> None:
    # The operator derives its peering priority from POD_NAME, so replicas never tie.
    env = {e["name"]: e for e in operator_container(defaults)["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_pod_meets_the_restricted_pod_security_standard(defaults: list[dict[str, Any]]) -> None:
    pod = operator_deployment(defaults)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = operator_container(defaults)["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == 65532
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in context
    for host_access in ("hostNetwork", "hostPID", "hostIPC"):
        assert host_access not in pod


def test_read_only_root_gets_a_writable_tmp(defaults: list[dict[str, Any]]) -> None:
    pod = operator_deployment(defaults)["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {}}]
    assert operator_container(defaults)["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]


def test_resources_have_requests_and_limits(defaults: list[dict[str, Any]]) -> None:
    resources = operator_container(defaults)["resources"]
    assert set(resources) == {"requests", "limits"}
    for bound in resources.values():
        assert set(bound) == {"cpu", "memory"}


def test_operator_uses_its_service_account_token(defaults: list[dict[str, Any]]) -> None:
    pod = operator_deployment(defaults)["spec"]["template"]["spec"]
    service_account = find_object(defaults, "ServiceAccount")
    assert pod["serviceAccountName"] == service_account["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is True
    assert service_account["automountServiceAccountToken"] is True


def test_selector_matches_the_pods_and_pod_labels_cannot_hijack_it(
    rendered: dict[str, Any],
) -> None:
    for name in ("defaults", "passthroughs"):
        deployment = operator_deployment(rendered[name])
        selector = deployment["spec"]["selector"]["matchLabels"]
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items(), name
        # The version changes on upgrade, and a Deployment's selector is immutable.
        assert "app.kubernetes.io/version" not in selector
    pod_labels = operator_deployment(rendered["passthroughs"])["spec"]["template"]["metadata"][
        "labels"
    ]
    assert pod_labels["team"] == "ml"
    assert pod_labels["app.kubernetes.io/name"] == "fleetwarden"


def test_scheduling_passthroughs(rendered: dict[str, Any]) -> None:
    values = VALUE_SETS["passthroughs"]
    pod_template = operator_deployment(rendered["passthroughs"])["spec"]["template"]
    pod = pod_template["spec"]
    assert pod_template["metadata"]["annotations"] == values["podAnnotations"]
    assert pod["imagePullSecrets"] == values["imagePullSecrets"]
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod["affinity"] == values["affinity"]
    assert pod["priorityClassName"] == values["priorityClassName"]
    default_pod = operator_deployment(rendered["defaults"])["spec"]["template"]
    # Unset passthroughs are omitted, not rendered as empty/null fields.
    assert "annotations" not in default_pod["metadata"]
    for field in (
        "imagePullSecrets",
        "nodeSelector",
        "tolerations",
        "affinity",
        "priorityClassName",
    ):
        assert field not in default_pod["spec"], field


def test_replicas_and_disruption_budget(rendered: dict[str, Any]) -> None:
    assert operator_deployment(rendered["defaults"])["spec"]["replicas"] == 1
    # A PDB with a single replica would block every node drain; none is rendered.
    assert objects_of_kind(rendered["defaults"], "PodDisruptionBudget") == []
    two = rendered["two-replicas"]
    deployment = operator_deployment(two)
    assert deployment["spec"]["replicas"] == 2
    pdb = find_object(two, "PodDisruptionBudget", FULLNAME)
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    disabled = render_chart({"replicaCount": 2, "podDisruptionBudget": {"enabled": False}})
    assert objects_of_kind(disabled, "PodDisruptionBudget") == []


# --- RBAC --------------------------------------------------------------------------------------


def test_no_wildcards_anywhere_in_rbac(rendered: dict[str, Any]) -> None:
    for objects in rendered.values():
        for role in objects_of_kind(objects, "ClusterRole") + objects_of_kind(objects, "Role"):
            for rule in role["rules"]:
                for field in ("apiGroups", "resources", "verbs"):
                    assert not any("*" in item for item in rule[field]), (role, rule)


def test_operator_role_grants_exactly_what_the_operator_needs(
    defaults: list[dict[str, Any]],
) -> None:
    granted = rule_set(find_object(defaults, "ClusterRole", FULLNAME))
    expected = {key: verbs for key, (verbs, _why) in EXPECTED_OPERATOR_RULES.items()}
    assert granted == expected


def test_fleetwarden_rules_match_the_shipped_crds(defaults: list[dict[str, Any]]) -> None:
    """Every fleetwarden.dev/kopf.dev rule names a shipped CRD, and the status rules exist only
    because the CRDs have a status subresource (Kopf patches .../status then)."""
    granted = rule_set(find_object(defaults, "ClusterRole", FULLNAME))
    crds = crd_sources().values()
    for group in ("fleetwarden.dev", "kopf.dev"):
        plurals = {c["spec"]["names"]["plural"] for c in crds if c["spec"]["group"] == group}
        with_status = {
            c["spec"]["names"]["plural"]
            for c in crds
            if c["spec"]["group"] == group
            and any("status" in v.get("subresources", {}) for v in c["spec"]["versions"])
        }
        resources = {resource for g, resource in granted if g == group}
        # Owners' finalizers: which kinds need them is derived in test_operator_rbac.py.
        finalizers = {resource for resource in resources if resource.endswith("/finalizers")}
        assert {resource.removesuffix("/finalizers") for resource in finalizers} <= plurals
        expected = plurals | {f"{plural}/status" for plural in with_status}
        assert resources - finalizers == expected, group
    # Kopf patches the peering object's status on the main resource only without a status
    # subresource, which is what the peering rule (patch, no .../status) relies on.
    assert not any(
        resource.endswith("/status") for group, resource in granted if group == "kopf.dev"
    )


def test_operator_role_is_bound_to_the_operator_service_account(
    rendered: dict[str, Any],
) -> None:
    cases = {"defaults": FULLNAME, "custom-service-account": "fw-operator"}
    cases["existing-service-account"] = "preexisting"
    for name, account in cases.items():
        objects = rendered[name]
        binding = find_object(objects, "ClusterRoleBinding", FULLNAME)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": FULLNAME,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": DEFAULT_NAMESPACE}
        ]
        pod = operator_deployment(objects)["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == account
    assert find_object(rendered["custom-service-account"], "ServiceAccount", "fw-operator")
    # An existing ServiceAccount is used, not created (Helm would otherwise fight over it).
    assert objects_of_kind(rendered["existing-service-account"], "ServiceAccount") == []


def test_existing_service_account_must_be_named() -> None:
    # Falling back to the namespace's `default` ServiceAccount would hand the operator's
    # permissions to every pod using it; the schema and the template both refuse.
    with pytest.raises(helm_python.HelmValuesError, match="serviceAccount/name"):
        render_chart({"serviceAccount": {"create": False}})


def test_aggregated_roles_let_users_manage_and_read_the_kinds(rendered: dict[str, Any]) -> None:
    objects = rendered["defaults"]
    editor = find_object(objects, "ClusterRole", f"{FULLNAME}-editor")
    viewer = find_object(objects, "ClusterRole", f"{FULLNAME}-viewer")
    assert editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-edit" not in viewer["metadata"]["labels"]
    read = {"get", "list", "watch"}
    write = {"create", "update", "patch", "delete", "deletecollection"}
    # RegionPools are cluster-scoped shared capacity: `edit` bound cluster-wide must not write them.
    namespaced = set(FLEETWARDEN_KINDS) - {"regionpools"}
    assert rule_set(editor) == {("fleetwarden.dev", k): read | write for k in namespaced}
    # Users never write status: that is the operator's report.
    assert rule_set(viewer) == {("fleetwarden.dev", k): read for k in FLEETWARDEN_KINDS}
    off = rendered["no-aggregated-roles"]
    assert {r["metadata"]["name"] for r in objects_of_kind(off, "ClusterRole")} == {FULLNAME}


# --- CRDs --------------------------------------------------------------------------------------


def test_one_crd_per_generated_file_with_content_unchanged(defaults: list[dict[str, Any]]) -> None:
    sources = crd_sources()
    rendered_crds = {
        crd["metadata"]["name"]: crd
        for crd in objects_of_kind(defaults, "CustomResourceDefinition")
    }
    assert rendered_crds.keys() == sources.keys()
    for name, crd in rendered_crds.items():
        # The template round-trips each file through fromYaml/toYaml: nothing may change but
        # labels and annotations (e.g. no number reformatting, no lost CEL rule).
        assert crd["spec"] == sources[name]["spec"], name
        assert crd["apiVersion"] == "apiextensions.k8s.io/v1"


def test_expected_crds_are_shipped() -> None:
    names = set(crd_sources())
    expected = {f"{plural}.fleetwarden.dev" for plural in FLEETWARDEN_KINDS}
    expected |= {f"{plural}.kopf.dev" for plural in KOPF_PEERINGS}
    assert names == expected
    # RegionPool is shared by ModelDeployments of many namespaces, hence the ClusterRole.
    assert crd_sources()["regionpools.fleetwarden.dev"]["spec"]["scope"] == "Cluster"


def test_crds_are_kept_on_uninstall_iff_crds_keep(rendered: dict[str, Any]) -> None:
    crd_files()
    kept = objects_of_kind(rendered["defaults"], "CustomResourceDefinition")
    not_kept = objects_of_kind(rendered["crds-not-kept"], "CustomResourceDefinition")
    assert kept
    assert not_kept
    for crd in kept:
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for crd in not_kept:
        assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


def test_shared_kopf_peering_crds_can_be_left_out(rendered: dict[str, Any]) -> None:
    """Every Kopf operator shares the kopf.dev CRDs: Helm fails to install over ones another
    operator created, and an uninstall without crds.keep would delete them from under it."""

    def crd_names(objects: list[dict[str, Any]]) -> set[str]:
        return {c["metadata"]["name"] for c in objects_of_kind(objects, "CustomResourceDefinition")}

    kopf_crds = {f"{plural}.kopf.dev" for plural in KOPF_PEERINGS}
    assert kopf_crds <= crd_names(rendered["defaults"])
    left_out = rendered["kopf-peering-crds-left-out"]
    assert crd_names(left_out) == crd_names(rendered["defaults"]) - kopf_crds
    # Only the CRDs differ: the operator still gets its peering rights for the existing CRDs.
    others = [o for o in left_out if o["kind"] != "CustomResourceDefinition"]
    assert others == [
        o for o in rendered["crds-not-kept"] if o["kind"] != "CustomResourceDefinition"
    ]
    # The value has no effect when the chart installs no CRDs at all.
    assert render_chart({"crds": {"enabled": False, "kopfPeering": True}}) == [
        o for o in rendered["defaults"] if o["kind"] != "CustomResourceDefinition"
    ]


def test_no_crds_when_disabled(rendered: dict[str, Any]) -> None:
    assert objects_of_kind(rendered["crds-disabled"], "CustomResourceDefinition") == []
    # Everything else is unchanged.
    others = [o for o in rendered["defaults"] if o["kind"] != "CustomResourceDefinition"]
    assert rendered["crds-disabled"] == others


@pytest.fixture
def chart_copy(tmp_path: Path) -> Path:
    """A throwaway copy of the chart whose files/crds/ a test may change."""
    copy_dir = tmp_path / "fleetwarden"
    shutil.copytree(CHART_DIR, copy_dir)
    shutil.rmtree(copy_dir / "files" / "crds", ignore_errors=True)
    (copy_dir / "files" / "crds").mkdir(parents=True)
    return copy_dir


DUMMY_CRD = """\
# A comment header like the generator's.
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.dev
  annotations:
    example.dev/owner: team
spec:
  group: example.dev
  scope: Namespaced
  names: {kind: Widget, plural: widgets, singular: widget}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-validations:
            - rule: "self.metadata.name.size() <= 40"
              messageExpression: "'name too long: ' + self.metadata.name"
              reason: FieldValueInvalid
          properties:
            spec:
              type: object
              properties:
                size: {type: integer, minimum: 1, maximum: 1000000}
                ratio: {type: number, maximum: 0.5}
                version: {type: string, enum: ["1.0", "2"]}
"""


def test_crd_template_keeps_existing_annotations_and_exact_values(chart_copy: Path) -> None:
    (chart_copy / "files" / "crds" / "widgets.yaml").write_text(DUMMY_CRD, encoding="utf-8")
    [crd] = objects_of_kind(render_chart(chart_dir=chart_copy), "CustomResourceDefinition")
    assert crd["metadata"]["annotations"] == {
        "example.dev/owner": "team",
        "helm.sh/resource-policy": "keep",
    }
    assert crd["spec"] == yaml.safe_load(DUMMY_CRD)["spec"]


def test_crd_template_renders_nothing_from_an_empty_folder(chart_copy: Path) -> None:
    assert objects_of_kind(render_chart(chart_dir=chart_copy), "CustomResourceDefinition") == []


def test_crd_template_rejects_a_file_that_is_not_a_crd(chart_copy: Path) -> None:
    (chart_copy / "files" / "crds" / "oops.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: oops}\n", encoding="utf-8"
    )
    with pytest.raises(helm_python.HelmRenderError, match="expected one CustomResourceDefinition"):
        render_chart(chart_dir=chart_copy)


# --- ServiceMonitor ----------------------------------------------------------------------------


def test_service_monitor_scrapes_serving_sidecars_in_all_namespaces(
    rendered: dict[str, Any],
) -> None:
    assert objects_of_kind(rendered["defaults"], "ServiceMonitor") == []
    monitor = find_object(rendered["service-monitor"], "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == DEFAULT_NAMESPACE
    # Extra labels let a Prometheus' serviceMonitorSelector pick it up.
    assert monitor["metadata"]["labels"]["release"] == "prom"
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"any": True}
    # The labels the operator puts on the serving Services it creates.
    assert spec["selector"] == {
        "matchLabels": {
            "app.kubernetes.io/managed-by": "fleetwarden",
            "app.kubernetes.io/component": "serving",
        }
    }
    assert spec["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]


# --- NOTES -------------------------------------------------------------------------------------


def test_notes_say_what_was_installed_and_what_to_do_next() -> None:
    notes = render_notes()
    assert "watching all namespaces" in notes
    assert f"kubectl -n {DEFAULT_NAMESPACE} rollout status deployment/{FULLNAME}" in notes
    assert "kubectl apply -f examples/" in notes
    assert "the fleetwarden.dev and kopf.dev CRDs" in notes
    namespaced = render_notes({"watchNamespaces": ["a", "b"], "crds": {"enabled": False}})
    assert "watching namespaces: a, b" in namespaced
    assert "a Role fleetwarden in each watched namespace" in namespaced
    assert "no CRDs" in namespaced
    shared = render_notes({"crds": {"kopfPeering": False}})
    assert "the fleetwarden.dev CRDs" in shared
    assert "no kopf.dev peering CRDs" in shared


# --- lint and values schema --------------------------------------------------------------------


@pytest.mark.parametrize("kube_version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    "value_set",
    ["defaults", "namespaced", "service-monitor", "two-replicas", "kopf-peering-crds-left-out"],
)
def test_strict_lint_passes(kube_version: str, value_set: str) -> None:
    report = lint_chart(VALUE_SETS[value_set], strict=True, kube_version=f"v{kube_version}")
    assert report.ok, report
    # Only the informational "icon is recommended" may remain.
    assert all(m.severity <= Severity.INFO for m in report.messages), report.messages


BAD_VALUES: dict[str, tuple[dict[str, Any], str]] = {
    "wrong type": ({"replicaCount": "two"}, "/replicaCount"),
    "typo at top level": ({"replicaCont": 2}, "replicaCont"),
    "typo nested": ({"image": {"tagg": "1.0"}}, "tagg"),
    "numeric tag": ({"image": {"tag": 1.0}}, "/image/tag"),
    "bad namespace name": ({"watchNamespaces": ["Not_A_Namespace"]}, "/watchNamespaces/0"),
    "duplicate namespace": ({"watchNamespaces": ["a", "a"]}, "/watchNamespaces"),
    "zero resync": ({"resyncSeconds": 0}, "/resyncSeconds"),
    "bad pull policy": ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    "bad quantity": ({"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory"),
    "typo in resources": ({"resources": {"limit": {"cpu": 1}}}, "limit"),
    "bad extra quantity": (
        {"resources": {"limits": {"ephemeral-storage": "lots"}}},
        "/resources/limits/ephemeral-storage",
    ),
    "bad interval": ({"serviceMonitor": {"interval": "often"}}, "/serviceMonitor/interval"),
    "non-boolean kopfPeering": ({"crds": {"kopfPeering": "no"}}, "/crds/kopfPeering"),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_schema_rejects_bad_values(case: str) -> None:
    values, where = BAD_VALUES[case]
    report = lint_chart(values, strict=True)
    assert not report.ok
    assert any(where in error for error in report.errors), report.errors
    # helm template/install refuse the same values before rendering anything.
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(where)):
        render_chart(values)


def _schema_node(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    node: dict[str, Any] = schema
    for key in path:
        child = node.get("properties", {}).get(key)
        if child is None:
            return None
        node = child
    return node


def _values_paths(
    values: dict[str, Any], prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """Every key path in values.yaml, parents included."""
    for key, value in values.items():
        path = (*prefix, key)
        yield path
        if isinstance(value, dict):
            yield from _values_paths(value, path)


def _schema_paths(node: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for key, child in node.get("properties", {}).items():
        path = (*prefix, key)
        yield path
        yield from _schema_paths(child, path)


def _load_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART_DIR / "values.yaml").read_text("utf-8"))
    return values


def _load_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART_DIR / "values.schema.json").read_text("utf-8"))
    return schema


#: In the schema but deliberately not in values.yaml: Helm injects `global` when this chart is a
#: subchart, and additionalProperties: false would otherwise reject every parent chart.
SCHEMA_ONLY = {("global",)}


def test_values_yaml_and_schema_declare_the_same_keys() -> None:
    schema = _load_schema()
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    values_paths = set(_values_paths(_load_values()))
    schema_paths = set(_schema_paths(schema))
    assert values_paths - schema_paths == set(), "values.yaml keys missing from the schema"
    assert schema_paths - values_paths == SCHEMA_ONLY, "schema keys missing from values.yaml"
    for path in schema_paths:
        node = _schema_node(schema, path)
        assert node is not None
        assert node.get("type"), f"{'.'.join(path)} has no type"
        assert node.get("description"), f"{'.'.join(path)} has no description"


def test_schema_objects_reject_unknown_keys() -> None:
    def walk(node: dict[str, Any], where: str) -> None:
        if "properties" in node:
            # Either closed, or every extra key must match a typed schema (resource quantities).
            extra = node.get("additionalProperties")
            assert extra is False or (isinstance(extra, dict) and extra.get("type")), where
        for key, child in node.get("properties", {}).items():
            walk(child, f"{where}.{key}")

    walk(_load_schema(), "<root>")


def test_defaults_pass_the_schema() -> None:
    with helm_python.Chart.load(CHART_DIR) as chart:
        assert chart.schema == _load_schema()
        chart.validate_schema(None)
        chart.validate_schema(copy.deepcopy(_load_values()))


def test_every_value_is_documented_by_a_comment_above_it() -> None:
    lines = (CHART_DIR / "values.yaml").read_text("utf-8").splitlines()
    key_line = re.compile(r"^\s*[A-Za-z][A-Za-z0-9]*:")
    for number, line in enumerate(lines):
        if key_line.match(line):
            above = lines[number - 1].strip() if number else ""
            assert above.startswith("#"), f"values.yaml:{number + 1} `{line.strip()}` undocumented"


_VALUES_REFERENCE = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def _template_references() -> set[tuple[str, ...]]:
    references: set[tuple[str, ...]] = set()
    for template in TEMPLATES_DIR.iterdir():
        for match in _VALUES_REFERENCE.finditer(template.read_text("utf-8")):
            references.add(tuple(match.group(1).lstrip(".").split(".")))
    return references


def test_every_value_is_used_by_a_template() -> None:
    """A value no template reads is a setting that silently does nothing."""
    references = _template_references()
    values = _load_values()
    leaves = [
        path
        for path in _values_paths(values)
        if not isinstance(_lookup(values, path), dict) or not _lookup(values, path)
    ]

    def used(path: tuple[str, ...]) -> bool:
        # `.Values.resources` consumed whole (toYaml) uses all of resources.*.
        return any(path[: len(ref)] == ref or ref[: len(path)] == path for ref in references)

    assert [".".join(p) for p in leaves if not used(p)] == []


def test_every_template_reference_exists_in_values_yaml() -> None:
    """Helm renders a misspelt `.Values.x` as empty instead of failing; catch it here."""
    values = _load_values()
    missing = [".".join(ref) for ref in _template_references() if _lookup(values, ref) is _MISSING]
    assert missing == []


_MISSING = object()


def _lookup(values: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(values, dict) or key not in values:
            return _MISSING
        values = values[key]
    return values


# --- Kubernetes schema validation --------------------------------------------------------------


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
def test_rendered_objects_are_valid_kubernetes(
    rendered: dict[str, list[dict[str, Any]]], kubernetes_version: str
) -> None:
    """Strict OpenAPI validation of every object of every value set (unknown fields rejected)."""
    unique: dict[str, dict[str, Any]] = {}
    for objects in rendered.values():
        for obj in objects:
            unique.setdefault(json.dumps(obj, sort_keys=True), obj)
    skipped = validate_objects(unique.values(), kubernetes_version, skip_kinds=UNVALIDATED_KINDS)
    # The ServiceMonitor is the only object not validated, and it was rendered.
    assert set(skipped) == UNVALIDATED_KINDS


def test_supported_kubernetes_versions() -> None:
    def minor(version: str) -> tuple[int, int]:
        major, minor, *_ = version.split(".")
        return int(major), int(minor)

    assert minor(OLDEST_KUBERNETES) < minor(NEWEST_KUBERNETES)
    # Helm refuses to install into clusters older than the chart's kubeVersion constraint.
    with helm_python.Chart.load(CHART_DIR) as chart:
        assert chart.metadata["kubeVersion"] == f">={OLDEST_KUBERNETES}-0"


# --- the install action, client-side ----------------------------------------------------------

_UNREACHABLE_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
users: [{name: none, user: {token: unused}}]
current-context: none
"""


def test_install_dry_run_matches_template_rendering() -> None:
    """`helm install --dry-run=client` goes through the real install action (kubeVersion check,
    schema, hooks/manifest split, release record) without a cluster, and installs exactly what
    render_chart returns."""
    with helm_python.Config(
        kubeconfig_content=_UNREACHABLE_KUBECONFIG,
        namespace=DEFAULT_NAMESPACE,
        storage_driver="memory",
    ) as config:
        release = config.install(CHART_DIR, DEFAULT_RELEASE, {}, dry_run="client")
    installed = [doc for doc in yaml.safe_load_all(release["manifest"]) if doc]

    def key(obj: dict[str, Any]) -> tuple[str, str]:
        return obj["kind"], obj["metadata"]["name"]

    assert sorted(installed, key=key) == sorted(render_chart(), key=key)
    assert "kubectl apply -f examples/" in release["notes"]
