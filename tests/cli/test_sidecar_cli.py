"""`fleetwarden sidecar --config`: a bad config file is one line naming the file, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetwarden.cli import main


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "Expecting value: line 1 column 1"),
        (b"[1]", "not a JSON object"),
        (b"\xff\xfe", "'utf-8' codec can't decode"),
        (b"{}", "validation error"),
    ],
)
def test_bad_config_file_is_named(
    tmp_path: Path, content: bytes, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The JSON parser's message alone (`Expecting value: line 1 column 1`) did not say which
    file; a JSON list was an AttributeError traceback."""
    config = tmp_path / "fairness.json"
    config.write_bytes(content)
    assert main(["sidecar", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fleetwarden sidecar: --config {config}: ")
    assert err.count("\n") == 1
    assert message in err


@pytest.mark.parametrize(
    "entry",
    ["POST /v1/*", "POST /v1/chat/completions", "GET /v1/../models", "get /v1/models", "GET /x"],
)
def test_bad_passthrough_route_is_refused(entry: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--passthrough` reaches the settings' checks: a route that could reach a scheduled one,
    a dot segment, a lowercase method or a path outside /v1/ is one line and exit 2, before the
    sidecar serves anything."""
    assert main(["sidecar", "--passthrough", "GET /v1/models", "--passthrough", entry]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fleetwarden sidecar: ")
    assert err.count("\n") == 1
    assert "passthrough" in err.lower()
