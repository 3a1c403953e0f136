"""Object validation the API server performs before storing anything (answers 422 Invalid).

Names, label keys and values, annotation keys and finalizer names are checked
with the apiserver's rules and messages: an operator that derives a label value
from a long object name, or a name from user input, fails here as it would on a
cluster instead of passing against a lenient fake.
"""

from __future__ import annotations

import re
from typing import Any

from tests.support import kube_errors as errors
from tests.support.kube_resources import ResourceType

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def validate_metadata(rt: ResourceType, obj: dict[str, Any], name: str) -> None:
    meta = obj["metadata"]
    causes: list[tuple[str, str, str]] = []
    if rt.group == "rbac.authorization.k8s.io":
        if name in (".", "..") or "/" in name or "%" in name:
            causes.append(
                (
                    "FieldValueInvalid",
                    "metadata.name",
                    f"Invalid value: \"{name}\": may not contain '/' or '%'",
                )
            )
    elif rt.plural == "namespaces":
        if not _DNS_LABEL.match(name) or len(name) > 63:
            causes.append(
                (
                    "FieldValueInvalid",
                    "metadata.name",
                    f'Invalid value: "{name}": a lowercase RFC 1123 label must consist of lower case '
                    "alphanumeric characters or '-', and must start and end with an alphanumeric "
                    "character (e.g. 'my-name',  or '123-abc', regex used for validation is "
                    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
                )
            )
    elif rt.plural == "services" and not rt.group:
        if not _DNS_1035.match(name) or len(name) > 63:
            causes.append(
                (
                    "FieldValueInvalid",
                    "metadata.name",
                    f'Invalid value: "{name}": a DNS-1035 label must consist of lower case '
                    "alphanumeric characters or '-', start with an alphabetic character, and end "
                    "with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for "
                    "validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
                )
            )
    elif not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
        causes.append(
            (
                "FieldValueInvalid",
                "metadata.name",
                f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                "character (e.g. 'example.com', regex used for validation is "
                "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            )
        )
    for field in ("labels", "annotations"):
        mapping = meta.get(field)
        if mapping is None:
            continue
        if not isinstance(mapping, dict):
            raise errors.bad_request(f"metadata.{field} must be a map of strings")
        for key, value in mapping.items():
            if not _qualified_ok(key):
                causes.append(
                    (
                        "FieldValueInvalid",
                        f"metadata.{field}",
                        f'Invalid value: "{key}": name part must consist of alphanumeric characters, '
                        "'-', '_' or '.', and must start and end with an alphanumeric character",
                    )
                )
            if not isinstance(value, str):
                raise errors.bad_request(
                    f"json: cannot unmarshal {type(value).__name__} into Go struct field "
                    f"ObjectMeta.metadata.{field} of type string"
                )
            if field == "labels" and (len(value) > 63 or not _LABEL_VALUE.match(value)):
                causes.append(
                    (
                        "FieldValueInvalid",
                        "metadata.labels",
                        f'Invalid value: "{value}": a valid label must be an empty string or consist '
                        "of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                        "alphanumeric character, and must be no more than 63 characters",
                    )
                )
    for finalizer in meta.get("finalizers") or []:
        if not isinstance(finalizer, str) or not _qualified_ok(finalizer):
            causes.append(
                (
                    "FieldValueInvalid",
                    "metadata.finalizers",
                    f'Invalid value: "{finalizer}": name part must consist of alphanumeric '
                    "characters, '-', '_' or '.'",
                )
            )
    if causes:
        raise errors.invalid(rt.kind, rt.group, name, causes)


def _qualified_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_QUALIFIED_NAME.match(name))


def validate_crd(crd: dict[str, Any]) -> None:
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    name = crd["metadata"].get("name", "")
    causes: list[tuple[str, str, str]] = []
    if not spec.get("group"):
        causes.append(("FieldValueRequired", "spec.group", "Required value"))
    if not names.get("plural") or not names.get("kind"):
        causes.append(("FieldValueRequired", "spec.names", "Required value: plural and kind"))
    elif name != f"{names['plural']}.{spec.get('group')}":
        causes.append(
            (
                "FieldValueInvalid",
                "metadata.name",
                f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group',
            )
        )
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        causes.append(
            (
                "FieldValueNotSupported",
                "spec.scope",
                f'Unsupported value: "{spec.get("scope")}": supported values: "Cluster", "Namespaced"',
            )
        )
    versions = spec.get("versions") or []
    if not versions:
        causes.append(("FieldValueRequired", "spec.versions", "Required value"))
    elif sum(1 for v in versions if v.get("storage")) != 1:
        causes.append(
            (
                "FieldValueInvalid",
                "spec.versions",
                "Invalid value: must have exactly one version marked as storage version",
            )
        )
    if causes:
        raise errors.invalid("CustomResourceDefinition", "apiextensions.k8s.io", name, causes)
