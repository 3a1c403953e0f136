"""The generated CRDs: up to date, structural, and accepted by Kubernetes' own CRD schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from fleetwarden.api.crds import KINDS, all_crds
from fleetwarden.cli import DEFAULT_CRD_DIRS, main, render_crd_files
from fleetwarden.cli.crds import GENERATED_HEADER
from tests.support.crd_admission import CrdAdmission

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("directory", DEFAULT_CRD_DIRS, ids=str)
def test_committed_crd_files_match_the_models(directory: Path) -> None:
    """Editing a model without running `fleetwarden crds` must fail CI, for both copies."""
    expected = render_crd_files()
    found = {p.name: p.read_text() for p in (ROOT / directory).glob("*.yaml")}
    assert found.keys() == expected.keys()
    stale = [name for name, text in expected.items() if found[name] != text]
    assert not stale, f"stale CRD files in {directory}: {stale}; run `fleetwarden crds`"


def test_committed_crd_reference_matches_the_models() -> None:
    from fleetwarden.api.reference import crd_reference

    committed = (ROOT / "docs" / "crd-reference.md").read_text()
    assert committed == crd_reference(), "stale docs/crd-reference.md; run `fleetwarden crds`"


def test_crd_reference_documents_every_spec_field() -> None:
    from fleetwarden.api.reference import crd_reference

    text = crd_reference()
    for field in ("spec.capacity.gpus", "spec.regions[].minInstances", "spec.tenants[].weight"):
        assert f"`{field}`" in text
    assert "rule (each item): minInstances must be <= maxInstances" in text
    assert "unique by pool" in text


def test_crds_check_flag_reports_stale_files(tmp_path: Path) -> None:
    assert main(["crds", "--out", str(tmp_path), "--check"]) == 1
    assert main(["crds", "--out", str(tmp_path)]) == 0
    assert main(["crds", "--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "regionpools.yaml").write_text("# hand-edited\n")
    assert main(["crds", "--out", str(tmp_path), "--check"]) == 1


def test_crds_remove_only_files_they_generated(tmp_path: Path) -> None:
    """A CRD no model generates any more is removed; the user's own YAML never is."""
    (tmp_path / "my-notes.yaml").write_text("notes: mine\n")
    (tmp_path / "oldkinds.yaml").write_text(GENERATED_HEADER + "kind: CustomResourceDefinition\n")
    assert main(["crds", "--out", str(tmp_path), "--check"]) == 1
    assert (tmp_path / "oldkinds.yaml").exists()
    assert main(["crds", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "my-notes.yaml").read_text() == "notes: mine\n"
    assert not (tmp_path / "oldkinds.yaml").exists()
    assert main(["crds", "--out", str(tmp_path), "--check"]) == 0


@pytest.mark.parametrize("below", ["", "sub"])
def test_crds_out_under_a_file_exits_2_in_one_line(
    tmp_path: Path, below: str, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    assert main(["crds", "--out", str(afile / below)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fleetwarden crds: cannot write ")
    assert err.count("\n") == 1
    assert "Not a directory" in err


def _walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for name, sub in (node.get("properties") or {}).items():
        found += _walk(sub, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        found += _walk(node["additionalProperties"], f"{path}{{}}")
    if "items" in node:
        found += _walk(node["items"], f"{path}[]")
    return found


@pytest.mark.parametrize("crd", list(all_crds().values()), ids=lambda c: c["metadata"]["name"])
def test_schemas_are_structural(crd: dict[str, Any]) -> None:
    """The API server refuses non-structural schemas; check its rules node by node."""
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        text = str(node)
        for construct in ("$ref", "anyOf", "allOf", "oneOf"):
            assert construct not in text, f"{path}: {construct}"
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        assert not ("properties" in node and "additionalProperties" in node), path
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(bound, True), bool), f"{path}: {bound} must be boolean"
        assert "title" not in node, path
        assert "const" not in node, path


@pytest.mark.parametrize("info", KINDS, ids=lambda k: k.kind)
def test_optional_fields_are_nullable_and_documented(info: Any) -> None:
    schema = all_crds()[f"{info.plural}.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    for path, node in _walk(spec):
        if path and not path.endswith(("[]", "{}")):
            assert node.get("description"), f"{info.kind} spec{path} has no description"
    optional = [
        (path, node)
        for path, node in _walk(spec)
        if path.count(".") == 1
        and not path.endswith(("[]", "{}"))
        and path[1:] not in spec.get("required", [])
    ]
    for path, node in optional:
        assert "default" in node or node.get("nullable") or node["type"] in ("array", "object"), (
            path
        )


def test_crds_declare_names_columns_and_status() -> None:
    crds = all_crds()
    short = {
        c["spec"]["names"]["kind"]: c["spec"]["names"].get("shortNames") for c in crds.values()
    }
    assert short["RegionPool"] == ["rp"]
    assert short["ModelDeployment"] == ["md"]
    assert short["TenantPolicy"] == ["tp"]
    for info in KINDS:
        crd = crds[f"{info.plural}.yaml"]
        assert crd["spec"]["scope"] == ("Namespaced" if info.namespaced else "Cluster")
        assert crd["spec"]["names"]["categories"] == ["fleetwarden"]
        version = crd["spec"]["versions"][0]
        assert version["subresources"] == {"status": {}}
        columns = {c["name"] for c in version["additionalPrinterColumns"]}
        assert {"Ready", "Age"} <= columns
    md_columns = {
        c["name"]
        for c in crds["modeldeployments.yaml"]["spec"]["versions"][0]["additionalPrinterColumns"]
    }
    assert {"Regions", "Instances", "Target", "ReadyPods"} <= md_columns


def test_printer_column_paths_exist_in_the_schema() -> None:
    """A column whose jsonPath names no field shows nothing forever; catch typos here."""
    for info in KINDS:
        crd = all_crds()[f"{info.plural}.yaml"]
        version = crd["spec"]["versions"][0]
        paths = {p for p, _ in _walk(version["schema"]["openAPIV3Schema"])}
        for column in version["additionalPrinterColumns"]:
            json_path = column["jsonPath"].split("[?")[0]
            if json_path.startswith(".metadata"):
                continue
            assert json_path in paths, f"{info.kind}: column {column['name']} -> {json_path}"


@pytest.mark.parametrize("k8s_version", ["1.30.0", "1.37.0"])
def test_crd_objects_validate_against_kubernetes(k8s_version: str) -> None:
    """kubernetes-validate checks each CRD against apiextensions.k8s.io/v1 in strict mode.

    It raises on any violation (unknown fields included) and returns the schema version it used;
    the version check catches a silent fallback to some other Kubernetes release's schemas.
    """
    for crd in all_crds().values():
        used = kubernetes_validate.validate(crd, k8s_version, strict=True)
        assert used == k8s_version.rsplit(".", 1)[0]


def test_every_cel_rule_compiles() -> None:
    admission = CrdAdmission(all_crds().values())
    rules = admission.rules()
    assert {
        "has(self.gpus) || has(self.instances)",
        "self.minInstances <= self.maxInstances",
        "self.scaleInUtilization < self.scaleOutUtilization",
        "self.releaseAt[0] > self.releaseAt[1]",
    } <= set(rules)
    for rule in rules:
        admission.compile(rule)


def test_generated_yaml_parses_back_to_the_same_objects() -> None:
    for name, text in render_crd_files().items():
        assert yaml.safe_load(text) == all_crds()[name]
