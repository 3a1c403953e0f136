"""fleetwarden.sidecar."""
