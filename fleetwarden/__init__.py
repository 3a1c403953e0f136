"""fleetwarden: a Kubernetes operator for multi-region LLM serving fleets."""

__version__ = "0.1.0"
