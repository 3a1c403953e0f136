"""Render, lint and validate the fleetwarden Helm chart with real Helm, offline.

Why real Helm: the chart's behaviour lives in Go templates (sprig functions, ``toYaml``
indentation, ``required``/``fail``, ``.Files.Glob``) and in Helm's own values handling (defaults
coalescing, ``values.schema.json`` validation). Re-implementing any of that in Python would test a
fiction, so everything here goes through helm-python-sdk, which embeds Helm v4's Go SDK (no
``helm`` binary, no cluster, no network).

Used by the chart tests (``tests/helm``) and meant for reuse by other tests and demo scripts that
need the objects the chart would install, e.g. to apply them to an API emulator.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any, Final

import helm_python
import kubernetes_validate
import yaml

__all__ = [
    "CHART_DIR",
    "DEFAULT_NAMESPACE",
    "DEFAULT_RELEASE",
    "LintMessage",
    "LintReport",
    "Severity",
    "find_object",
    "lint_chart",
    "objects_of_kind",
    "render_chart",
    "render_manifests",
    "render_notes",
    "validate_objects",
]

#: The chart in this repository.
CHART_DIR: Final[Path] = Path(__file__).resolve().parents[2] / "helm" / "fleetwarden"
#: Where the README and the demo install the operator.
DEFAULT_NAMESPACE: Final[str] = "fleetwarden-system"
#: The release name; it contains the chart name, so objects are named plainly `fleetwarden`.
DEFAULT_RELEASE: Final[str] = "fleetwarden"

_NOTES_SUFFIX: Final[str] = "NOTES.txt"


def render_manifests(
    values: Mapping[str, Any] | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    release: str = DEFAULT_RELEASE,
    *,
    chart_dir: Path | str = CHART_DIR,
) -> dict[str, str]:
    """Render the chart like ``helm template`` and return ``{template path: rendered text}``.

    The values are validated against ``values.schema.json`` first, as ``helm template`` and
    ``helm install`` do, so a bad value raises ``helm_python.HelmValuesError`` instead of
    rendering something Helm would refuse. Template failures (``required``, ``fail``) raise
    ``helm_python.HelmRenderError``.
    """
    helm_python.validate_release_name(release)
    with helm_python.Chart.load(chart_dir) as chart:
        plain_values = None if values is None else dict(values)
        chart.validate_schema(plain_values)
        return chart.render(plain_values, name=release, namespace=namespace, is_install=True)


def render_chart(
    values: Mapping[str, Any] | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    release: str = DEFAULT_RELEASE,
    *,
    chart_dir: Path | str = CHART_DIR,
) -> list[dict[str, Any]]:
    """Render the chart and return every Kubernetes object it would install, parsed.

    Objects come in template path order, and in document order within a template. ``NOTES.txt``
    (text, not an object) and empty documents (templates whose ``if`` is false) are dropped.
    """
    manifests = render_manifests(values, namespace, release, chart_dir=chart_dir)
    objects: list[dict[str, Any]] = []
    for path in sorted(manifests):
        if path.endswith(_NOTES_SUFFIX):
            continue
        for document in yaml.safe_load_all(manifests[path]):
            if document is None:
                continue
            if not isinstance(document, dict):
                raise TypeError(f"{path} rendered a {type(document).__name__}, not an object")
            objects.append(document)
    return objects


def render_notes(
    values: Mapping[str, Any] | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    release: str = DEFAULT_RELEASE,
    *,
    chart_dir: Path | str = CHART_DIR,
) -> str:
    """The rendered ``NOTES.txt``: what ``helm install`` prints to the user afterwards."""
    manifests = render_manifests(values, namespace, release, chart_dir=chart_dir)
    return "".join(text for path, text in manifests.items() if path.endswith(_NOTES_SUFFIX))


class Severity(IntEnum):
    """Severity of a lint message, as numbered by Helm's ``support.Message``."""

    UNKNOWN = 0
    INFO = 1
    WARNING = 2
    ERROR = 3


@dataclass(frozen=True)
class LintMessage:
    """One finding of ``helm lint``."""

    severity: Severity
    path: str
    error: str


@dataclass(frozen=True)
class LintReport:
    """The outcome of ``helm lint``: findings are data, not exceptions."""

    messages: tuple[LintMessage, ...]
    errors: tuple[str, ...]
    strict: bool

    @property
    def failures(self) -> tuple[LintMessage, ...]:
        """Messages that make ``helm lint`` exit non-zero (warnings too when strict)."""
        threshold = Severity.WARNING if self.strict else Severity.ERROR
        return tuple(message for message in self.messages if message.severity >= threshold)

    @property
    def ok(self) -> bool:
        """Whether ``helm lint`` (``--strict`` if ``strict``) would pass."""
        return not self.errors and not self.failures


def lint_chart(
    values: Mapping[str, Any] | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    *,
    strict: bool = True,
    kube_version: str | None = None,
    chart_dir: Path | str = CHART_DIR,
) -> LintReport:
    """Run ``helm lint`` (``--strict`` by default) on the chart with optional extra values.

    Lint renders the templates, checks Chart.yaml, the YAML of each rendered object and the values
    against ``values.schema.json``. ``kube_version`` (e.g. ``"v1.30.0"``) sets the Kubernetes
    version templates see in ``.Capabilities``.
    """
    report = helm_python.lint(
        chart_dir,
        None if values is None else dict(values),
        strict=strict,
        namespace=namespace,
        kube_version=kube_version,
    )
    messages = tuple(
        LintMessage(Severity(int(m["severity"])), str(m["path"]), str(m["error"]))
        for m in report.get("messages") or []
    )
    errors = tuple(str(error) for error in report.get("errors") or [])
    return LintReport(messages=messages, errors=errors, strict=strict)


def objects_of_kind(objects: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    """All rendered objects of one kind, in render order."""
    return [dict(obj) for obj in objects if obj.get("kind") == kind]


def find_object(
    objects: Iterable[Mapping[str, Any]], kind: str, name: str | None = None
) -> dict[str, Any]:
    """The one object of ``kind`` (and ``name``, if given); raises if there is not exactly one."""
    matches = [
        obj
        for obj in objects_of_kind(objects, kind)
        if name is None or obj["metadata"]["name"] == name
    ]
    if len(matches) != 1:
        found = [obj["metadata"]["name"] for obj in objects_of_kind(objects, kind)]
        raise LookupError(f"expected one {kind} named {name or '<any>'}, found {found}")
    return matches[0]


def validate_objects(
    objects: Iterable[Mapping[str, Any]],
    kubernetes_version: str,
    *,
    skip_kinds: Iterable[tuple[str, str]] = (),
) -> list[tuple[str, str]]:
    """Validate objects against the Kubernetes OpenAPI schemas, strictly, for one version.

    Strict mode rejects unknown fields, so a mis-indented template (a field landing one level off)
    fails here even though the API server would silently drop it. ``skip_kinds`` lists
    ``(apiVersion, kind)`` pairs kubernetes-validate has no schema for (custom resources); any
    other unknown kind is an error. Raises ``kubernetes_validate.ValidationError`` on the first
    invalid object, and ``ValueError`` if the schemas for exactly ``kubernetes_version`` are
    missing (kubernetes-validate would otherwise silently fall back to an older version).

    Returns the ``(apiVersion, kind)`` of the objects that were skipped.
    """
    wanted = _major_minor(kubernetes_version)
    skip = set(skip_kinds)
    skipped: list[tuple[str, str]] = []
    for obj in objects:
        key = (str(obj.get("apiVersion")), str(obj.get("kind")))
        if key in skip:
            skipped.append(key)
            continue
        used = kubernetes_validate.validate(dict(obj), kubernetes_version, strict=True)
        if _major_minor(str(used)) != wanted:
            raise ValueError(f"kubernetes-validate has no {wanted} schemas (it used {used})")
    return skipped


def _major_minor(version: str) -> str:
    """``"v1.30.2"`` -> ``"1.30"``."""
    major, minor, *_ = version.removeprefix("v").split(".")
    return f"{major}.{minor}"
