"""The reference reading of an engine's `/metrics`: `prometheus_client`'s full text parser.

The sidecar's `parse_engine_metrics` scans only the sample lines it needs (a full parse of a real
vLLM exposition cost 12.5 ms on the event loop); the tests check it against this slow, complete
parse, which is what the sidecar used before. Both fold their samples with the same
`reading_from`, so what is compared is which samples each one finds and their values.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from fleetwarden.sidecar.engine_metrics import EngineReading, reading_from


def reference_reading(text: str) -> EngineReading:
    """The reading after a full parse of `text` (raises on any malformed line)."""
    return reading_from(
        (sample.name, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )
