"""Tests of the simulator package: engine model, replay, workloads, metrics."""
