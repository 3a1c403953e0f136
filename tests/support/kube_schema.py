"""Structural-schema pruning and validation for custom resources.

The real API server *prunes* every field of a custom resource that its CRD's
``openAPIV3Schema`` does not declare (unless ``x-kubernetes-preserve-unknown-fields``)
and rejects type/enum/required violations with 422. Operators trip over both:
a status field missing from the schema silently vanishes, and Kopf's own
``status.kopf`` bookkeeping needs the schema to preserve unknown fields.
Without this, tests would pass against the emulator and fail on a cluster.
"""

from __future__ import annotations

import json
import re
from typing import Any

_ROOT_KEEP = ("apiVersion", "kind", "metadata")


def prune(value: Any, schema: dict[str, Any] | None, *, root: bool = False) -> Any:
    """Drop fields the schema does not declare, as the apiextensions-apiserver does."""
    if schema is None:
        return value
    if isinstance(value, dict):
        preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        embedded = bool(schema.get("x-kubernetes-embedded-resource"))
        properties: dict[str, Any] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        result: dict[str, Any] = {}
        for key, item in value.items():
            if (root or embedded) and key in _ROOT_KEEP:
                result[key] = item
            elif key in properties:
                result[key] = prune(item, properties[key])
            elif isinstance(additional, dict):
                result[key] = prune(item, additional)
            elif additional is True or preserve:
                result[key] = item
        return result
    if isinstance(value, list):
        items = schema.get("items")
        return [prune(item, items if isinstance(items, dict) else None) for item in value]
    return value


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
}


def _type_ok(value: Any, expected: str) -> bool:
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES.get(expected, (object,)))


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else json.dumps(value, default=str)


def validate(
    value: Any, schema: dict[str, Any] | None, path: str = ""
) -> list[tuple[str, str, str]]:
    """Return ``(reason, field, message)`` causes for violations of the common keywords."""
    if schema is None:
        return []
    causes: list[tuple[str, str, str]] = []
    field = path or "<root>"
    if value is None:
        if schema.get("nullable") or not schema.get("type"):
            return []
        return [
            (
                "FieldValueInvalid",
                field,
                f'Invalid value: "null": {field} in body must be of type {schema["type"]}: "null"',
            )
        ]
    expected = schema.get("type")
    int_or_string = schema.get("x-kubernetes-int-or-string")
    if int_or_string:
        if not (isinstance(value, str) or _type_ok(value, "integer")):
            causes.append(
                (
                    "FieldValueInvalid",
                    field,
                    f"Invalid value: {_show(value)}: {field} in body must be of type integer or string",
                )
            )
            return causes
    elif expected and not _type_ok(value, expected):
        actual = {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
            type(value), "number"
        )
        causes.append(
            (
                "FieldValueInvalid",
                field,
                f'Invalid value: {_show(value)}: {field} in body must be of type {expected}: "{actual}"',
            )
        )
        return causes
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_show(item) for item in schema["enum"])
        causes.append(
            (
                "FieldValueNotSupported",
                field,
                f"Unsupported value: {_show(value)}: supported values: {supported}",
            )
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and (
            value < schema["minimum"]
            or (schema.get("exclusiveMinimum") is True and value == schema["minimum"])
        ):
            causes.append(
                (
                    "FieldValueInvalid",
                    field,
                    f"Invalid value: {value}: {field} in body should be greater than or equal to {schema['minimum']}",
                )
            )
        if "maximum" in schema and (
            value > schema["maximum"]
            or (schema.get("exclusiveMaximum") is True and value == schema["maximum"])
        ):
            causes.append(
                (
                    "FieldValueInvalid",
                    field,
                    f"Invalid value: {value}: {field} in body should be less than or equal to {schema['maximum']}",
                )
            )
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            causes.append(
                (
                    "FieldValueInvalid",
                    field,
                    f"Invalid value: {_show(value)}: {field} in body should be at least {schema['minLength']} chars long",
                )
            )
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            causes.append(
                (
                    "FieldValueTooLong",
                    field,
                    f"Too long: may not be more than {schema['maxLength']} bytes",
                )
            )
        if "pattern" in schema and not re.search(schema["pattern"], value):
            causes.append(
                (
                    "FieldValueInvalid",
                    field,
                    f"Invalid value: {_show(value)}: {field} in body should match '{schema['pattern']}'",
                )
            )
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            causes.append(
                (
                    "FieldValueInvalid",
                    field,
                    f"Invalid value: {len(value)}: {field} in body should have at least {schema['minItems']} items",
                )
            )
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            causes.append(
                (
                    "FieldValueTooMany",
                    field,
                    f"Too many: {len(value)}: must have at most {schema['maxItems']} items",
                )
            )
        items = schema.get("items")
        if isinstance(items, dict):
            for index, item in enumerate(value):
                causes.extend(validate(item, items, f"{path}[{index}]"))
    if isinstance(value, dict):
        properties: dict[str, Any] = schema.get("properties") or {}
        for required in schema.get("required") or []:
            if required not in value:
                sub = f"{path}.{required}" if path else required
                causes.append(("FieldValueRequired", sub, "Required value"))
        for key, item in value.items():
            if not path and key in _ROOT_KEEP:
                continue
            sub = f"{path}.{key}" if path else key
            if key in properties:
                causes.extend(validate(item, properties[key], sub))
            elif isinstance(schema.get("additionalProperties"), dict):
                causes.extend(validate(item, schema["additionalProperties"], sub))
    for sub_schema in schema.get("allOf") or []:
        causes.extend(validate(value, sub_schema, path))
    return causes
