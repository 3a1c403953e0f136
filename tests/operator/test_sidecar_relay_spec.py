"""`spec.sidecar.relay` chooses the sidecar's stream relay per ModelDeployment.

The C relay became the default in the image; without this field the only way back to the Python
relay for one model was pinning an older sidecar image.
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


def test_unset_writes_no_flag() -> None:
    # No flag for the default: an operator upgrade must not roll every serving pod.
    assert "--relay" not in _sidecar_args()
    assert "--relay" not in _sidecar_args(relay="auto")


@pytest.mark.parametrize("relay", ["python", "native"])
def test_a_choice_reaches_the_sidecar(relay: str) -> None:
    args = _sidecar_args(relay=relay)
    assert args[args.index("--relay") + 1] == relay


def test_an_unknown_relay_is_refused_at_admission() -> None:
    with pytest.raises(ValidationError, match="relay"):
        region_target(sidecar={"relay": "c"})


def test_the_flag_the_operator_writes_starts_the_sidecar(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The sidecar parses it: with a bad flag it would exit 2 before serving; here it gets as far
    as the missing config file, past the relay setting."""
    args = _sidecar_args(relay="python")
    flags = args[args.index("--relay") : args.index("--relay") + 2]
    assert main(["sidecar", *flags, "--config", "/nonexistent/fairness.json"]) == 2
    assert "config file /nonexistent/fairness.json does not exist" in capsys.readouterr().err


def test_relay_nice_unset_writes_no_flag_and_a_value_reaches_the_sidecar(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`spec.sidecar.relayNice`: unset keeps the sidecar's default (no flag, no pod roll on
    upgrade); 0, the setting for a sidecar that shares its core, is written and parses."""
    assert "--relay-nice" not in _sidecar_args()
    args = _sidecar_args(relayNice=0)
    flags = args[args.index("--relay-nice") : args.index("--relay-nice") + 2]
    assert flags == ["--relay-nice", "0"]
    assert main(["sidecar", *flags, "--config", "/nonexistent/fairness.json"]) == 2
    assert "config file /nonexistent/fairness.json does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("nice", [-1, 20])
def test_a_relay_nice_outside_0_to_19_is_refused_at_admission(nice: int) -> None:
    with pytest.raises(ValidationError, match=r"relay_?[nN]ice"):
        region_target(sidecar={"relayNice": nice})
