"""Decode the few Kubernetes protobuf request bodies that real clients send.

client-go's typed clientsets (as used by Helm's release storage) send
``application/vnd.kubernetes.protobuf`` bodies when creating, updating and
deleting Secrets/ConfigMaps, even though they accept JSON responses. The
emulator answers in JSON, so only *decoding* is needed, and only for the kinds
in :data:`SCHEMAS`; other protobuf bodies get a clear 415.

Field numbers come from the ``generated.proto`` files of k8s.io/api and
k8s.io/apimachinery; the wire format is plain protobuf inside the
``k8s\\x00`` + ``runtime.Unknown`` envelope.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

MAGIC = b"k8s\x00"

# A schema maps field number -> (json name, type); types: "string", "bytes", "int",
# "bool", "time", ("msg", schema), ("map", value type), ("list", item type).
Schema = dict[int, tuple[str, Any]]

TIME: Schema = {1: ("seconds", "int"), 2: ("nanos", "int")}
OWNER_REFERENCE: Schema = {
    1: ("kind", "string"),
    3: ("name", "string"),
    4: ("uid", "string"),
    5: ("apiVersion", "string"),
    6: ("controller", "bool"),
    7: ("blockOwnerDeletion", "bool"),
}
OBJECT_META: Schema = {
    1: ("name", "string"),
    2: ("generateName", "string"),
    3: ("namespace", "string"),
    5: ("uid", "string"),
    6: ("resourceVersion", "string"),
    7: ("generation", "int"),
    8: ("creationTimestamp", "time"),
    9: ("deletionTimestamp", "time"),
    10: ("deletionGracePeriodSeconds", "int"),
    11: ("labels", ("map", "string")),
    12: ("annotations", ("map", "string")),
    13: ("ownerReferences", ("list", ("msg", OWNER_REFERENCE))),
    14: ("finalizers", ("list", "string")),
}
SECRET: Schema = {
    1: ("metadata", ("msg", OBJECT_META)),
    2: ("data", ("map", "bytes")),
    3: ("type", "string"),
    4: ("stringData", ("map", "string")),
    5: ("immutable", "bool"),
}
CONFIG_MAP: Schema = {
    1: ("metadata", ("msg", OBJECT_META)),
    2: ("data", ("map", "string")),
    3: ("binaryData", ("map", "bytes")),
    4: ("immutable", "bool"),
}
PRECONDITIONS: Schema = {1: ("uid", "string"), 2: ("resourceVersion", "string")}
DELETE_OPTIONS: Schema = {
    1: ("gracePeriodSeconds", "int"),
    2: ("preconditions", ("msg", PRECONDITIONS)),
    3: ("orphanDependents", "bool"),
    4: ("propagationPolicy", "string"),
    5: ("dryRun", ("list", "string")),
}
SCHEMAS: dict[str, Schema] = {
    "Secret": SECRET,
    "ConfigMap": CONFIG_MAP,
    "DeleteOptions": DELETE_OPTIONS,
}


class ProtobufError(ValueError):
    """The body is not a protobuf message the emulator can decode."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """Split a message into (field number, wire type, raw value) triples."""
    pos, fields = 0, []
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
        elif wire == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos : pos + 4], pos + 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
        fields.append((number, wire, value))
    return fields


def _scalar(kind: Any, raw: Any) -> Any:
    if kind == "string":
        return raw.decode("utf-8")
    if kind == "bytes":
        return base64.b64encode(raw).decode()
    if kind == "int":
        return raw - (1 << 64) if raw >= 1 << 63 else raw
    if kind == "bool":
        return bool(raw)
    if kind == "time":
        seconds = decode_message(raw, TIME).get("seconds", 0)
        moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(kind, tuple) and kind[0] == "msg":
        return decode_message(raw, kind[1])
    raise ProtobufError(f"unsupported field type {kind!r}")


def decode_message(data: bytes, schema: Schema) -> dict[str, Any]:
    """Decode a message into its JSON form; unknown fields are skipped."""
    result: dict[str, Any] = {}
    for number, _, raw in _fields(data):
        if number not in schema:
            continue
        name, kind = schema[number]
        if isinstance(kind, tuple) and kind[0] == "map":
            entry = {n: v for n, _, v in _fields(raw)}
            key = entry.get(1, b"").decode("utf-8")
            result.setdefault(name, {})[key] = _scalar(kind[1], entry.get(2, b""))
        elif isinstance(kind, tuple) and kind[0] == "list":
            result.setdefault(name, []).append(_scalar(kind[1], raw))
        else:
            value = _scalar(kind, raw)
            if value not in ("", None) or kind == "bool":
                result[name] = value
    return result


def decode(body: bytes) -> dict[str, Any]:
    """Decode a ``k8s\\x00``-enveloped object into the JSON dict the client meant to send."""
    if not body.startswith(MAGIC):
        raise ProtobufError("missing the k8s protobuf envelope")
    envelope = {n: v for n, _, v in _fields(body[len(MAGIC) :])}
    type_meta = {n: v.decode() for n, _, v in _fields(envelope.get(1, b""))}
    api_version, kind = type_meta.get(1, ""), type_meta.get(2, "")
    if kind not in SCHEMAS:
        raise ProtobufError(
            f"protobuf bodies of kind {kind or '<none>'!r} are not supported by the emulator"
        )
    obj = decode_message(envelope.get(2, b""), SCHEMAS[kind])
    if kind != "DeleteOptions":
        obj = {"apiVersion": api_version, "kind": kind, **obj}
    return obj
