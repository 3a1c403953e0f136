"""Does a live object still hold what the operator wants? Pure comparison, no I/O.

The API server adds defaults (imagePullPolicy, terminationMessagePath, ...) and normalises
quantities ("0.5" CPU comes back as "500m"), so "live == desired" would report drift forever and the
operator would patch in a loop. Instead every value the operator sets must be present in the live
object with the same meaning; anything the server or other controllers add is left alone.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

EXACT_MAPS = frozenset({"nodeSelector", "matchLabels", "data"})
"""Maps the operator owns whole: a key someone else adds there is drift, and is removed."""

_SUFFIXES = {
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "K": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}


def parse_quantity(text: str) -> Decimal | None:
    """A Kubernetes quantity as a number, or None when `text` is not one."""
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix):
            number, scale = text[: -len(suffix)], _SUFFIXES[suffix]
            break
    else:
        number, scale = text, Decimal(1)
    try:
        return Decimal(number) * scale
    except InvalidOperation:
        return None


def _same_scalar(desired: Any, live: Any, in_resources: bool) -> bool:
    if desired == live:
        return True
    if in_resources and isinstance(desired, str) and isinstance(live, (str, int, float)):
        a, b = parse_quantity(desired), parse_quantity(str(live))
        return a is not None and a == b
    return False


def drifted_paths(desired: Any, live: Any, path: str = "", in_resources: bool = False) -> list[str]:
    """Paths where `live` does not hold what `desired` says; empty when nothing drifted.

    Maps: every desired key must be present and match (extra live keys are fine). Lists: same
    length, element by element, because the operator owns every list it sets (containers, ports).
    """
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return [path or "."]
        found: list[str] = []
        if path.rsplit(".", 1)[-1] in EXACT_MAPS:
            found += [f"{path}.{key}" for key in live if key not in desired]
        for key, value in desired.items():
            sub = f"{path}.{key}"
            if key not in live:
                if value in ({}, [], None):
                    continue  # the server drops empty values; absent means the same
                found.append(sub)
                continue
            nested_resources = in_resources or key in ("requests", "limits")
            found += drifted_paths(value, live[key], sub, nested_resources)
        return found
    if isinstance(desired, list):
        if not isinstance(live, list) or len(desired) != len(live):
            return [path]
        found = []
        for index, (want, have) in enumerate(zip(desired, live, strict=True)):
            found += drifted_paths(want, have, f"{path}[{index}]", in_resources)
        return found
    return [] if _same_scalar(desired, live, in_resources) else [path]


def merge_patch_for(desired: Any, live: Any, key: str = "") -> Any:
    """An RFC 7386 merge patch that makes `live` hold `desired`.

    Merge patches merge maps, so a key removed from an owned map (a pool's nodeSelector, say) would
    survive a plain patch of `desired`; here such keys are set to null, which deletes them.
    """
    if not isinstance(desired, dict):
        return desired
    patch = {
        k: merge_patch_for(v, live.get(k) if isinstance(live, dict) else None, k)
        for k, v in desired.items()
    }
    if key in EXACT_MAPS and isinstance(live, dict):
        patch.update({k: None for k in live if k not in desired})
    return patch
