"""fleetwarden.batch."""
