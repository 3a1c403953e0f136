"""fleetwarden.scaling."""
