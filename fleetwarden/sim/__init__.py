"""fleetwarden.sim."""
