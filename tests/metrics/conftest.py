"""Fixtures of the metrics tests: the real-Prometheus factory from tests/support."""

from tests.support.prometheus_server import prometheus_factory

__all__ = ["prometheus_factory"]
