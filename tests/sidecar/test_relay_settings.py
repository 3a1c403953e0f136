"""`relay_nice`: the C relay thread's niceness is checked where settings are read.

Why: the C relay refuses a niceness outside 0-19 only when the event loop builds it, after the
sidecar has started listening; a bad `--relay-nice` must instead fail at startup, with the other
bad settings (exit 2 and a message), not as a traceback in the app's lifecycle.
"""

from __future__ import annotations

import pytest

from fleetwarden.sidecar.native_relay import RELAY_NICE
from fleetwarden.sidecar.settings import SettingsError, SidecarSettings


@pytest.mark.parametrize("nice", [-1, 20, 39])
def test_a_niceness_outside_0_to_19_is_refused(nice: int) -> None:
    with pytest.raises(SettingsError, match="relay_nice must be between 0 and 19"):
        SidecarSettings(relay_nice=nice)


@pytest.mark.parametrize("nice", [0, 10, 19])
def test_a_niceness_inside_0_to_19_is_kept(nice: int) -> None:
    assert SidecarSettings(relay_nice=nice).relay_nice == nice


def test_the_default_yields_the_core_to_the_event_loop() -> None:
    assert SidecarSettings().relay_nice == RELAY_NICE == 19
