"""fleetwarden.forecasting."""
