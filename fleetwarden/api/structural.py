"""Turn a pydantic model's JSON Schema into a Kubernetes *structural* OpenAPI v3 schema.

The API server accepts only structural schemas for CRDs (apiextensions.k8s.io/v1): no `$ref`, every
node has a `type`, no `anyOf` carrying types, `additionalProperties` never beside `properties`,
OpenAPI 3.0's boolean `exclusiveMinimum`, and `nullable` instead of a `null` type. Pydantic emits
JSON Schema 2020-12, so this module rewrites the one into the other. It is pure: a dict in, a dict out.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, NoDefault
from pydantic_core import core_schema, to_jsonable_python

JsonSchema = dict[str, Any]

_DROPPED_KEYS = ("title", "$defs", "examples", "discriminator")


class SchemaConversionError(ValueError):
    """The model uses a construct that has no structural OpenAPI equivalent."""


def structural_schema(model: type[BaseModel]) -> JsonSchema:
    """The structural schema of `model`, with `$ref`s inlined and defaults made Kubernetes-safe."""
    raw = model.model_json_schema(
        by_alias=True, mode="validation", schema_generator=_KubernetesDefaults
    )
    definitions = raw.get("$defs", {})
    return _convert(raw, definitions, path=model.__name__)


class _KubernetesDefaults(GenerateJsonSchema):
    """Emit defaults the way the API server applies them.

    Pydantic leaves `default_factory` values out of the schema, so an omitted `scaling:` would reach
    `kubectl get -o yaml` without its defaults. Here factories are called, and model defaults are
    serialised by alias with only the values their own schema does not already default: the API
    server defaults top-down, so `tiers: {}` becomes `tiers: {iwF: {ttftSeconds: 1}, ...}` and then
    each nested field gets its own default.
    """

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        if "default" in schema:
            value = schema["default"]
        elif "default_factory" in schema and not schema.get("default_factory_takes_data"):
            value = schema["default_factory"]()  # type: ignore[call-arg]
        else:
            return NoDefault
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        return to_jsonable_python(value)


def _resolve(node: JsonSchema, definitions: dict[str, JsonSchema], path: str) -> JsonSchema:
    ref = node.get("$ref")
    if ref is None:
        return node
    name = ref.rsplit("/", 1)[-1]
    if name not in definitions:
        raise SchemaConversionError(f"{path}: unresolvable $ref {ref}")
    merged = copy.deepcopy(definitions[name])
    # Keys beside a $ref (description, default) belong to the use site and win over the definition.
    merged.update({k: v for k, v in node.items() if k != "$ref"})
    return merged


def _convert(node: JsonSchema, definitions: dict[str, JsonSchema], path: str) -> JsonSchema:
    node = _resolve(node, definitions, path)
    node = _collapse_nullable(node, definitions, path)
    out: JsonSchema = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "properties":
            out["properties"] = {
                name: _convert(sub, definitions, f"{path}.{name}") for name, sub in value.items()
            }
        elif key == "items":
            out["items"] = _convert(value, definitions, f"{path}[]")
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out["additionalProperties"] = _convert(value, definitions, f"{path}{{}}")
            # `false` (from extra="forbid") is dropped: the API server prunes unknown fields instead.
        elif key in ("anyOf", "oneOf", "allOf"):
            raise SchemaConversionError(f"{path}: {key} has no structural equivalent")
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = copy.deepcopy(value)
    _fix_exclusive_bounds(out)
    _fix_default(out, path)
    if "properties" in out and "additionalProperties" in out:
        raise SchemaConversionError(f"{path}: properties and additionalProperties together")
    if "type" not in out:
        raise SchemaConversionError(f"{path}: every node needs a type")
    return out


def _collapse_nullable(
    node: JsonSchema, definitions: dict[str, JsonSchema], path: str
) -> JsonSchema:
    """`anyOf: [X, {type: null}]` (pydantic's Optional) becomes X with `nullable: true`."""
    options = node.get("anyOf")
    if options is None:
        return node
    non_null = [opt for opt in options if opt.get("type") != "null"]
    if len(non_null) != 1 or len(non_null) == len(options):
        raise SchemaConversionError(f"{path}: only Optional[X] unions are supported")
    inner = _resolve(non_null[0], definitions, path)
    merged = {**copy.deepcopy(inner), **{k: v for k, v in node.items() if k != "anyOf"}}
    merged["nullable"] = True
    if merged.get("default", 0) is None:
        del merged["default"]
    return merged


def _fix_exclusive_bounds(out: JsonSchema) -> None:
    """JSON Schema 2020's numeric exclusive bounds become OpenAPI 3.0's boolean form."""
    for exclusive, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        value = out.get(exclusive)
        if isinstance(value, bool) or value is None:
            continue
        out[inclusive] = value
        out[exclusive] = True


def _fix_default(out: JsonSchema, path: str) -> None:
    """Empty list defaults are dropped: the API server would store `[]` in every object otherwise."""
    if out.get("default") == [] or (out.get("default") == {} and "additionalProperties" in out):
        del out["default"]
