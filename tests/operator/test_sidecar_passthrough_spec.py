"""`spec.sidecar.passthrough` reaches every serving pod's sidecar, checked by the sidecar's own
rules at admission.

The passthrough became an allowlist (default `GET /v1/models`, `/v1/models/**`), but only the
CLI could change it: a ModelDeployment that served embeddings through its sidecar had them
answered 404 after the upgrade, with no way back.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from fleetwarden.cli import main
from fleetwarden.operator import builders
from tests.operator.fixtures import region_target


def _sidecar_args(**sidecar: Any) -> list[str]:
    pod = builders.build_deployment(region_target(sidecar=sidecar))["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "sidecar"]
    args: list[str] = container["args"]
    return args


def _passthrough(args: list[str]) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == "--passthrough"]


def test_unset_keeps_the_sidecars_default_and_adds_no_flag() -> None:
    # No flag at all: an operator upgrade must not roll every serving pod.
    assert "--passthrough" not in _sidecar_args()


def test_a_list_replaces_the_default() -> None:
    routes = ["POST /v1/embeddings", "GET /v1/models/**"]
    assert _passthrough(_sidecar_args(passthrough=routes)) == routes


def test_an_empty_list_allows_none() -> None:
    assert _passthrough(_sidecar_args(passthrough=[])) == [""]


@pytest.mark.parametrize(
    "route",
    ["POST /v1/*", "POST /v1/chat/completions", "GET /v1/../models", "get /v1/models", "GET /x"],
)
def test_routes_the_sidecar_would_refuse_are_refused_at_admission(route: str) -> None:
    with pytest.raises(ValidationError, match="passthrough"):
        region_target(sidecar={"passthrough": [route]})


def test_the_flags_the_operator_writes_start_the_sidecar(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The sidecar parses the operator's flags: with a bad one it would exit 2 before serving;
    here it gets as far as the missing config file, past every passthrough check."""
    args = _sidecar_args(passthrough=["POST /v1/embeddings", "GET /v1/models"])
    flags = [
        a for i, a in enumerate(args) if a == "--passthrough" or args[i - 1] == "--passthrough"
    ]
    assert main(["sidecar", *flags, "--config", "/nonexistent/fairness.json"]) == 2
    assert "config file /nonexistent/fairness.json does not exist" in capsys.readouterr().err
