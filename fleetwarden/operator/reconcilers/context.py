"""What every reconciler needs from the outside world, and the status-write guard they share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetwarden.operator.events import EventSink
from fleetwarden.operator.kube import KubeClient


@dataclass(frozen=True)
class Context:
    """The API client, the Event sink, defaults from the command line, and the clock."""

    kube: KubeClient
    events: EventSink
    sidecar_image: str
    now: Callable[[], str]
    """Current time as RFC 3339 text; injected so tests control it."""


def status_unchanged(current: dict[str, Any], desired: dict[str, Any]) -> bool:
    """Whether merge-patching `desired` (None removes a field) would leave `current` as it is.

    Reconcilers skip unchanged status writes: each write is an event that wakes every watcher,
    and an operator that writes on every pass never goes quiet.
    """
    return all(
        current.get(key) == value if value is not None else key not in current
        for key, value in desired.items()
    )
