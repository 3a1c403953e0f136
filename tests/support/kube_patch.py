"""The three PATCH flavours of the Kubernetes API, written from their specs.

* JSON merge-patch (RFC 7386): what Kopf and ``CustomObjectsApi`` send.
* JSON patch (RFC 6902): what Kopf sends for finalizers, guarded by a ``test``
  of ``/metadata/resourceVersion`` for optimistic concurrency.
* Strategic merge-patch: what the ``kubernetes`` client sends for *dict*
  bodies on built-in kinds. The real algorithm is driven by Go struct tags;
  here it is approximated by a table of the list fields that real clients
  rely on being merged by key (containers by ``name``, ports, env, ...).

All functions are pure: they never mutate their inputs, so a failed patch
leaves the stored object untouched (the server applies patches atomically).
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    """The patch cannot be applied; the server answers 422 (or 400 for malformed ones)."""


class MalformedPatchError(PatchError):
    """The patch document itself is not a valid patch of its declared type (HTTP 400)."""


# ---------------------------------------------------------------------------
# RFC 7386: JSON merge-patch
# ---------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply a JSON merge-patch: dicts merge recursively, ``null`` deletes, the rest replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: dict[str, Any] = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ---------------------------------------------------------------------------
# RFC 6902: JSON patch
# ---------------------------------------------------------------------------


def _parse_pointer(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"invalid JSON pointer: {pointer!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in pointer[1:].split("/")]


def _index(container: list[Any], token: str, *, for_insert: bool) -> int:
    if token == "-" and for_insert:
        return len(container)
    if not token.isdigit() or (token.startswith("0") and token != "0"):
        raise PatchError(f"invalid array index: {token!r}")
    idx = int(token)
    limit = len(container) if for_insert else len(container) - 1
    if idx > limit:
        raise PatchError(f"array index out of bounds: {idx}")
    return idx


def _resolve_parent(doc: Any, tokens: list[str], path: str) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f"doc is missing path: {path!r}")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, for_insert=False)]
        else:
            raise PatchError(f"doc is missing path: {path!r}")
    return node


def _get(doc: Any, path: str) -> Any:
    node = doc
    for token in _parse_pointer(path):
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f"doc is missing path: {path!r}")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, for_insert=False)]
        else:
            raise PatchError(f"doc is missing path: {path!r}")
    return node


def _add(doc: Any, path: str, value: Any) -> Any:
    tokens = _parse_pointer(path)
    if not tokens:
        return copy.deepcopy(value)
    parent = _resolve_parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, for_insert=True), copy.deepcopy(value))
    else:
        raise PatchError(f"doc is missing path: {path!r}")
    return doc


def _remove(doc: Any, path: str) -> Any:
    tokens = _parse_pointer(path)
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _resolve_parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"unable to remove nonexistent key: {last}: missing value")
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(parent, last, for_insert=False)]
    else:
        raise PatchError(f"doc is missing path: {path!r}")
    return doc


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: numbers compare by value (1 == 1.0), but booleans are not numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and bool(a == b)


def json_patch(target: Any, operations: Any) -> Any:
    """Apply an RFC 6902 patch atomically; a failed ``test`` raises :class:`PatchError`."""
    if not isinstance(operations, list):
        raise MalformedPatchError(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
        )
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise MalformedPatchError(f"invalid JSON patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise MalformedPatchError(f"missing value for {kind} operation")
        if kind == "add":
            doc = _add(doc, path, op["value"])
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)  # must exist
            doc = _remove(doc, path) if _parse_pointer(path) else doc
            doc = _add(doc, path, op["value"])
        elif kind == "move":
            value = _get(doc, op["from"])
            doc = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, _get(doc, op["from"]))
        elif kind == "test":
            try:
                actual = _get(doc, path)
            except PatchError:
                raise PatchError(f"testing value {path} failed: doc is missing path") from None
            if not _json_equal(actual, op["value"]):
                raise PatchError(f"testing value {path} failed: test failed")
        else:
            raise MalformedPatchError(f"unexpected kind: {kind}")
    return doc


# ---------------------------------------------------------------------------
# Strategic merge-patch (approximation)
# ---------------------------------------------------------------------------

# field name -> merge key, for lists of objects that the real server merges by key.
# "ports" is ambiguous: container ports merge by containerPort, service ports by port.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "envFrom": "",  # atomic in reality; listed to document the decision
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "conditions": "type",
    "ownerReferences": "uid",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
}
# Lists of scalars that the real server unions instead of replacing.
MERGED_SCALAR_LISTS = {"finalizers"}


def _merge_key_for(field: str, items: list[Any]) -> str | None:
    if field == "ports":
        sample = next((item for item in items if isinstance(item, dict)), {})
        return "containerPort" if "containerPort" in sample else "port"
    key = MERGE_KEYS.get(field)
    return key or None


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Merge-patch semantics plus key-wise merging of well-known lists and ``$patch`` directives."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result: dict[str, Any] = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$patch", "$retainKeys"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = [item for item in result[field] if item not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(key, result[key], value)
        elif isinstance(value, list):
            result[key] = [
                strategic_merge_patch(None, item) if isinstance(item, dict) else copy.deepcopy(item)
                for item in value
                if not (isinstance(item, dict) and item.get("$patch") == "delete")
            ]
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _merge_list(field: str, current: list[Any], patch: list[Any]) -> list[Any]:
    if field in MERGED_SCALAR_LISTS:
        merged = list(current)
        merged.extend(item for item in patch if item not in merged)
        return copy.deepcopy(merged)
    merge_key = _merge_key_for(field, current + patch)
    if merge_key is None or not all(isinstance(item, dict) for item in current + patch):
        if any(isinstance(item, dict) and "$patch" in item for item in patch):
            return [
                copy.deepcopy(item)
                for item in patch
                if not (isinstance(item, dict) and "$patch" in item)
            ]
        return copy.deepcopy(patch)
    merged = [copy.deepcopy(item) for item in current]
    for item in patch:
        key_value = item.get(merge_key)
        index = next(
            (i for i, existing in enumerate(merged) if existing.get(merge_key) == key_value), None
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del merged[index]
        elif index is None:
            merged.append(strategic_merge_patch(None, item))
        else:
            merged[index] = strategic_merge_patch(merged[index], item)
    return merged
