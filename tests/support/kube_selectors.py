"""Label and field selectors, parsed with the grammar of apimachinery's ``labels.Parse``.

Operators and Helm filter lists and watches by labels (Helm finds its release
Secrets with ``owner=helm,name=<release>``; Kopf can be restricted with label
filters), so the emulator must filter exactly like the server: a selector that
silently matched everything would hide bugs in the operator's selectors.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Requirement = Callable[[Mapping[str, str]], bool]

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[A-Za-z0-9_.-]*"


class SelectorError(ValueError):
    """A malformed selector; the server answers 400 BadRequest."""


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``( ... )`` value sets."""
    parts: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced parentheses in selector: {text!r}")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise SelectorError(f"unbalanced parentheses in selector: {text!r}")
    parts.append(current)
    return [part.strip() for part in parts if part.strip()]


def _parse_requirement(text: str) -> Requirement:
    match = re.fullmatch(rf"({_KEY})\s+(in|notin)\s+\(([^)]*)\)", text)
    if match:
        key, op, raw_values = match.groups()
        values = {value.strip() for value in raw_values.split(",") if value.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    match = re.fullmatch(rf"!\s*({_KEY})", text)
    if match:
        key = match.group(1)
        return lambda labels: key not in labels
    match = re.fullmatch(rf"({_KEY})\s*(==|!=|=|>|<)\s*({_VALUE})", text)
    if match:
        key, op, value = match.groups()
        if op in ("=", "=="):
            return lambda labels: labels.get(key) == value
        if op == "!=":
            return lambda labels: labels.get(key) != value
        try:
            number = int(value)
        except ValueError:
            raise SelectorError(
                f"for 'Gt', 'Lt' operators, the value must be an integer: {text!r}"
            ) from None

        def compare(labels: Mapping[str, str]) -> bool:
            try:
                actual = int(labels[key])
            except (KeyError, ValueError):
                return False
            return actual > number if op == ">" else actual < number

        return compare
    match = re.fullmatch(_KEY, text)
    if match:
        return lambda labels: text in labels
    raise SelectorError(f"unable to parse requirement: {text!r}")


def parse_label_selector(text: str | None) -> Callable[[dict[str, Any]], bool]:
    """Compile ``labelSelector`` into a predicate over a whole object."""
    requirements = [_parse_requirement(part) for part in _split_top_level(text or "")]

    def check(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(requirement(labels) for requirement in requirements)

    return check


def _field_value(obj: dict[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return ""
        node = node[part]
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def _field_check(path: str, value: str, *, negate: bool) -> Callable[[dict[str, Any]], bool]:
    def check(obj: dict[str, Any]) -> bool:
        return (_field_value(obj, path) == value) != negate

    return check


def parse_field_selector(text: str | None) -> Callable[[dict[str, Any]], bool]:
    """Compile ``fieldSelector``: ``=``/``==``/``!=`` on any dotted path (e.g. ``metadata.name``).

    The real server only indexes a few fields per kind (and 400s on others);
    the emulator accepts any path, which is a superset and never hides a match.
    """
    checks: list[Callable[[dict[str, Any]], bool]] = []
    for part in _split_top_level(text or ""):
        match = re.fullmatch(r"([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*)", part)
        if not match:
            raise SelectorError(f"invalid selector: {part!r}; can't understand {part!r}")
        path, op, value = match.groups()
        checks.append(_field_check(path, value, negate=op == "!="))

    def check(obj: dict[str, Any]) -> bool:
        return all(fn(obj) for fn in checks)

    return check
