"""Kubernetes Events for what the operator does, so `kubectl describe` tells the story.

Reconcilers talk to an `EventSink`; the production sink hands Events to Kopf's poster (which batches
them and never blocks a reconcile), and tests use a recording sink.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, cast

import kopf

from fleetwarden.operator.fleet import ObjectRecord

NORMAL = "Normal"
WARNING = "Warning"
MAX_MESSAGE = 1024
"""The API server caps Event messages; longer ones are cut here with a marker instead."""


class EventSink(Protocol):
    def post(self, obj: ObjectRecord, type_: str, reason: str, message: str) -> None: ...


def _clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


class KopfEvents:
    """Posts through Kopf's event queue (only valid inside a running operator)."""

    def post(self, obj: ObjectRecord, type_: str, reason: str, message: str) -> None:
        body = kopf.Body(cast(kopf.RawBody, obj.reference))
        kopf.event(body, type=type_, reason=reason, message=_clip(message))


@dataclass
class RecordingEvents:
    """Keeps Events in memory, for tests and the offline demo."""

    events: list[tuple[str, str, str, str]] = field(default_factory=list)

    def post(self, obj: ObjectRecord, type_: str, reason: str, message: str) -> None:
        self.events.append((obj.key, type_, reason, _clip(message)))
