"""What every handler module shares: the registry-building signature and the runtime lookup."""

from __future__ import annotations

from typing import Any

import kopf

from fleetwarden.api.v1alpha1 import GROUP, VERSION
from fleetwarden.operator.fleet import ObjectRecord
from fleetwarden.operator.runtime import Coalescer, Runtime

__all__ = ["GROUP", "VERSION", "observe", "runtime_of"]


def runtime_of(memo: Any, kwargs: dict[str, Any]) -> Runtime:
    """The process's Runtime, with Kopf's indices bound to it."""
    runtime = getattr(memo, "runtime", None)
    if not isinstance(runtime, Runtime):
        raise kopf.PermanentError("operator runtime missing: the startup handler did not run")
    runtime.bind(kwargs)
    return runtime


def observe(
    runtime: Runtime, kind: str, record: ObjectRecord, event_type: str | None, own: Coalescer
) -> bool:
    """Ask for a reconcile of the object itself; True when its spec changed or it went away.

    Dependents (ModelDeployments using a pool, or selected by a policy) only need a reconcile in
    the second case: our own status writes also arrive as events and must not fan out.
    """
    if event_type == "DELETED":
        runtime.forget(kind, record)
        return True
    own.request(record.key)
    return runtime.generation_changed(kind, record)
