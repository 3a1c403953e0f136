"""Parsing Kubernetes API paths into what they address.

kmock's own parser crashes on ``/api/v1/namespaces`` and reads
``/api/v1/namespaces/default`` as a namespace with no resource, so the
emulator parses paths itself, following the apiserver's URL layout.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Route:
    """A parsed API path; ``level`` says which part of the API tree it addresses."""

    level: str  # "api" | "apis" | "group" | "groupversion" | "resource"
    group: str = ""
    version: str = ""
    plural: str = ""
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    watch_prefix: bool = False  # the deprecated /api/v1/watch/... form


def parse_route(path: str) -> Route | None:
    """Parse ``/api/...`` and ``/apis/...`` paths, including ``/api/v1/namespaces/{name}``.

    Returns ``None`` for non-API paths (``/version``, ``/openapi/v3``, ...).
    """
    parts = [part for part in path.split("/") if part]
    if not parts or parts[0] not in ("api", "apis"):
        return None
    if parts[0] == "api":
        if len(parts) == 1:
            return Route("api")
        group, version, rest = "", parts[1], parts[2:]
    else:
        if len(parts) == 1:
            return Route("apis")
        if len(parts) == 2:
            return Route("group", group=parts[1])
        group, version, rest = parts[1], parts[2], parts[3:]
    if not rest:
        return Route("groupversion", group=group, version=version)
    watch_prefix = rest[0] == "watch"
    if watch_prefix:
        rest = rest[1:]
        if not rest:
            return None
    namespace = None
    # /namespaces/{ns}/status and /finalize are subresources of a Namespace, not namespaced kinds.
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    return Route(
        "resource",
        group=group,
        version=version,
        plural=rest[0],
        namespace=namespace,
        name=rest[1] if len(rest) > 1 else None,
        subresource="/".join(rest[2:]) or None,
        watch_prefix=watch_prefix,
    )
