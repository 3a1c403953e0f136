"""fleetwarden.api."""
