"""fleetwarden.operator."""
