"""What the API server does to a custom resource before storing it, for offline tests.

A real API server, given our CRDs, runs these steps on every create; this module runs the same steps
with real validators, so `examples/` can be shown accepted and `examples/invalid/` rejected without a
cluster (mocked: only the API server process itself, which cannot run here):

1. strict field validation (`kubectl apply --validate=strict`, the default): unknown fields rejected;
2. structural defaulting from the schema's `default`s, top-down;
3. OpenAPI v3 schema validation (openapi-schema-validator, OAS 3.0 dialect);
4. `x-kubernetes-list-type: map` key uniqueness;
5. CEL `x-kubernetes-validations` (cel-python), with values typed as the schema says (a `number`
   written as 5 reaches CEL as the double 5.0, as in the API server).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import yaml
from openapi_schema_validator import OAS30Validator
from pydantic import BaseModel, ValidationError

JsonDict = dict[str, Any]


class AdmissionError(Exception):
    """The object would be refused; `errors` are the API server-style messages."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class _Kind:
    api_version: str
    kind: str
    schema: JsonDict


def load_crds(directory: Path) -> list[JsonDict]:
    return [
        doc
        for path in sorted(directory.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


class CrdAdmission:
    """Admission of custom resources against a set of CRDs."""

    def __init__(self, crds: Iterable[JsonDict]) -> None:
        self._kinds: dict[tuple[str, str], _Kind] = {}
        self._cel = celpy.Environment()
        self._programs: dict[str, Any] = {}
        for crd in crds:
            group = crd["spec"]["group"]
            for version in crd["spec"]["versions"]:
                api_version = f"{group}/{version['name']}"
                kind = crd["spec"]["names"]["kind"]
                schema = version["schema"]["openAPIV3Schema"]
                self._kinds[(api_version, kind)] = _Kind(api_version, kind, schema)

    def admit(self, obj: JsonDict) -> JsonDict:
        """The object as it would be stored (with defaults), or raise `AdmissionError`."""
        key = (obj.get("apiVersion", ""), obj.get("kind", ""))
        if key not in self._kinds:
            raise AdmissionError([f"no CRD serves {key[0]} {key[1]}"])
        schema = self._kinds[key].schema
        errors = list(_unknown_fields(obj, schema, ""))
        if errors:
            raise AdmissionError(errors)
        stored = _with_defaults(copy.deepcopy(obj), schema)
        validator = OAS30Validator(schema)
        errors = [
            f"{_path(e.absolute_path) or '<root>'}: {e.message}"
            for e in sorted(validator.iter_errors(stored), key=lambda e: list(e.absolute_path))
        ]
        if errors:
            raise AdmissionError(errors)
        errors = list(_list_map_duplicates(stored, schema, ""))
        errors += list(self._cel_failures(stored, schema, ""))
        if errors:
            raise AdmissionError(errors)
        return stored

    def rules(self) -> list[str]:
        """Every CEL rule of every kind (for a test that they all compile)."""
        found: list[str] = []
        for kind in self._kinds.values():
            _collect_rules(kind.schema, found)
        return found

    def compile(self, rule: str) -> Any:
        if rule not in self._programs:
            self._programs[rule] = self._cel.program(self._cel.compile(rule))
        return self._programs[rule]

    def _cel_failures(self, value: Any, schema: JsonDict, path: str) -> Iterable[str]:
        if value is None:
            return
        for validation in schema.get("x-kubernetes-validations", []):
            result = self.compile(validation["rule"]).evaluate(
                {"self": celpy.json_to_cel(_typed(value, schema))}
            )
            if not isinstance(result, celpy.celtypes.BoolType) or not bool(result):
                yield f"{path or '<root>'}: Invalid value: {validation['message']}"
        if isinstance(value, dict):
            for name, sub in (schema.get("properties") or {}).items():
                if name in value:
                    yield from self._cel_failures(value[name], sub, _join(path, name))
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict):
                for name, sub_value in value.items():
                    yield from self._cel_failures(sub_value, extra, _join(path, name))
        elif isinstance(value, list) and "items" in schema:
            for index, item in enumerate(value):
                yield from self._cel_failures(item, schema["items"], f"{path}[{index}]")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _path(parts: Iterable[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _unknown_fields(value: Any, schema: JsonDict, path: str) -> Iterable[str]:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        if path == "metadata" or (properties is None and extra is None):
            return
        for name, sub in value.items():
            if properties is not None and name in properties:
                yield from _unknown_fields(sub, properties[name], _join(path, name))
            elif isinstance(extra, dict):
                yield from _unknown_fields(sub, extra, _join(path, name))
            else:
                yield f'unknown field "{_join(path, name)}"'
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from _unknown_fields(item, schema["items"], f"{path}[{index}]")


def _with_defaults(value: Any, schema: JsonDict) -> Any:
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = _with_defaults(value[name], sub)
    elif isinstance(value, list) and "items" in schema:
        return [_with_defaults(item, schema["items"]) for item in value]
    return value


def _list_map_duplicates(value: Any, schema: JsonDict, path: str) -> Iterable[str]:
    if isinstance(value, list):
        if schema.get("x-kubernetes-list-type") == "map":
            keys = schema["x-kubernetes-list-map-keys"]
            seen: set[tuple[Any, ...]] = set()
            for index, item in enumerate(value):
                key = tuple(item.get(k) for k in keys)
                if key in seen:
                    yield f"{path}[{index}]: Duplicate value: {dict(zip(keys, key, strict=True))}"
                seen.add(key)
        for index, item in enumerate(value):
            yield from _list_map_duplicates(item, schema.get("items", {}), f"{path}[{index}]")
    elif isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in value:
                yield from _list_map_duplicates(value[name], sub, _join(path, name))


def _typed(value: Any, schema: JsonDict) -> Any:
    """Values as the API server hands them to CEL: `number` fields are doubles."""
    kind = schema.get("type")
    if kind == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        return {
            k: _typed(v, properties.get(k) or (extra if isinstance(extra, dict) else {}))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_typed(v, schema.get("items", {})) for v in value]
    return value


def _collect_rules(schema: JsonDict, found: list[str]) -> None:
    found += [v["rule"] for v in schema.get("x-kubernetes-validations", [])]
    for sub in (schema.get("properties") or {}).values():
        _collect_rules(sub, found)
    if isinstance(schema.get("additionalProperties"), dict):
        _collect_rules(schema["additionalProperties"], found)
    if "items" in schema:
        _collect_rules(schema["items"], found)


def verdicts(admission: CrdAdmission, model: type[BaseModel], obj: JsonDict) -> tuple[bool, bool]:
    """Whether the API server (`admission`: the CRD's schema and rules) and the pydantic `model`
    of the spec accept `obj`: the two must agree on every input."""
    try:
        admission.admit(obj)
        crd_ok = True
    except AdmissionError:
        crd_ok = False
    try:
        model.model_validate(obj["spec"])
        model_ok = True
    except ValidationError:
        model_ok = False
    return crd_ok, model_ok
