"""Pieces of the raw-socket engines that the relay's tests stand up (test_engine_pool.py,
test_relay_soak.py): request framing and the one metrics page the sidecar's telemetry reads."""

from __future__ import annotations

METRICS = b'vllm:num_requests_waiting{model_name="stub-model"} 0\n'
METRICS_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(METRICS), METRICS)
"""What a raw engine answers to `GET /metrics`."""


def next_request(buf: bytes) -> tuple[str, bytes, bytes] | None:
    """The first whole request in `buf` (Content-Length framed): its head, its body and the
    bytes after it; None while it is incomplete."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buf[:end].decode("latin-1")
    length = 0
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    if len(buf) < end + 4 + length:
        return None
    return head, buf[end + 4 : end + 4 + length], buf[end + 4 + length :]
