"""Which engine routes a sidecar passes through unscheduled: the rules of its allowlist.

Here, below both the sidecar (which enforces the list) and the API (whose ModelDeployment
carries it for the operator to hand to every sidecar), so both check an entry the same way:
a list the CRD accepts is one the sidecar starts with.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


class PassthroughError(ValueError):
    """A passthrough entry that is malformed or could reach a scheduled route."""


SCHEDULED_ROUTES = ("/v1/chat/completions", "/v1/completions")
"""The routes every call of which goes through the fair scheduler; never passed through."""
DEFAULT_PASSTHROUGH = ("GET /v1/models", "GET /v1/models/**")
"""Engine routes passed through unscheduled by default: read-only model listing. Routes that
make the engine work (embeddings, responses, audio, score, rerank) or change it (LoRA adapter
loading) are not: they would take engine capacity past the fair scheduler."""
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


@dataclass(frozen=True, slots=True)
class PassthroughRoute:
    """One engine route clients may call through the sidecar unscheduled: a method and the
    path's segments, where `*` stands for one segment and a last `**` for one or more (model
    ids such as `org/name` hold a slash)."""

    method: str
    segments: tuple[str, ...]

    @classmethod
    def parse(cls, entry: str) -> PassthroughRoute:
        """`METHOD /v1/path` (for example `GET /v1/models/**`); PassthroughError when malformed."""
        method, _, path = entry.strip().partition(" ")
        path = path.strip()
        if method not in _METHODS:
            raise PassthroughError(
                f"passthrough route {entry!r}: the method must be one of {sorted(_METHODS)}"
            )
        segments = tuple(path.split("/")[1:])
        # Literal segments only: no escapes, dot segments or empty segments, which an engine
        # could resolve to another route than the one written here.
        bad = [
            s
            for s in segments
            if not s
            or s in (".", "..")
            or any(c in "%\\?#" or c.isspace() for c in s)
            or ("*" in s and s not in ("*", "**"))
        ]
        if not path.startswith("/v1/") or bad or "**" in segments[:-1]:
            raise PassthroughError(
                f"passthrough route {entry!r}: the path must be /v1/ and literal segments, "
                "`*` (one segment) or a last `**` (one or more)"
            )
        route = cls(method, segments)
        for scheduled in SCHEDULED_ROUTES:
            if route.matches_path(scheduled.split("/")[1:]):
                raise PassthroughError(
                    f"passthrough route {entry!r} covers {scheduled}, which is always scheduled"
                )
        return route

    def matches_path(self, segments: Sequence[str]) -> bool:
        """Whether the (decoded) path `segments` fit this route's, whatever the method."""
        pattern = self.segments
        if pattern[-1] == "**":
            pattern = pattern[:-1]
            if len(segments) <= len(pattern):
                return False
        elif len(segments) != len(pattern):
            return False
        return all(p in ("*", s) for p, s in zip(pattern, segments, strict=False))

    def matches(self, method: str, segments: Sequence[str]) -> bool:
        return method == self.method and self.matches_path(segments)


def parse_passthrough(entries: Iterable[str]) -> tuple[PassthroughRoute, ...]:
    """The routes of a passthrough setting; empty entries are skipped (so `""` allows none)."""
    return tuple(PassthroughRoute.parse(e) for e in entries if e.strip())
