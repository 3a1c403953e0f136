"""Tests of the metric-name contract, the PromQL builders and the Prometheus client."""
