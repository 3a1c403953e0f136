"""What every handler module shares: the registry-building signature and the runtime lookup."""

from __future__ import annotations

from typing import Any

import kopf

from fleetwarden.api.v1alpha1 import GROUP, VERSION
from fleetwarden.operator.runtime import Runtime

__all__ = ["GROUP", "VERSION", "runtime_of"]


def runtime_of(memo: Any, kwargs: dict[str, Any]) -> Runtime:
    """The process's Runtime, with Kopf's indices bound to it."""
    runtime = getattr(memo, "runtime", None)
    if not isinstance(runtime, Runtime):
        raise kopf.PermanentError("operator runtime missing: the startup handler did not run")
    runtime.bind(kwargs)
    return runtime
