"""fleetwarden: a Kubernetes operator for multi-region LLM serving fleets."""

from fleetwarden.compiled import check_source_checkout

__version__ = "0.1.0"

check_source_checkout()
