"""fleetwarden.fairness."""
