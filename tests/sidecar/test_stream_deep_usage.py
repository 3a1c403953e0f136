"""An engine event that mentions usage but nests too deeply for Python's parser is relayed as an
ordinary event, not an exception in the engine connection's read callback (which would have torn
the stream down with a traceback)."""

from __future__ import annotations

from fleetwarden.sidecar.stream import split_events


def test_a_deeply_nested_usage_event_is_relayed_without_a_usage() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    event = b'data: {"usage":{"x":' + deep + b"}}\n\n"
    out, rest, usage, tokens = split_events(event + b"data: [DONE]\n\n", client_wants_usage=True)
    assert usage is None
    assert rest == b""
    assert out.endswith(b"data: [DONE]\n\n")
    assert tokens == 0  # no choices it could parse: treated as a usage-only event
    assert out.startswith(b'data: {"usage"')  # passed on to a client that asked for usage
