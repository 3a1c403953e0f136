"""Tests of the forecasting core: forecaster and capacity planner."""
