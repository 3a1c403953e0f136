"""fleetwarden.metrics."""
