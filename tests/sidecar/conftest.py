"""Every sidecar test runs with both stream relays: the C one (`native_relay`) and Python's.

The sidecars these tests start take their `relay` setting from `relay_under_test()`
(`tests/support/sidecar_stack.py`, `test_relay_soak.py`); this fixture sets it per run. Where the
C relay is not built (no compiler when the package was installed), its runs skip and say why.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetwarden.sidecar.native_relay import NATIVE_MISSING
from tests.support import relay_mode


@pytest.fixture(autouse=True, params=["native", "python"])
def relay(request: pytest.FixtureRequest) -> Iterator[str]:
    mode: str = request.param
    if mode == "native" and NATIVE_MISSING is not None:
        pytest.skip(NATIVE_MISSING)
    previous, relay_mode.CURRENT = relay_mode.CURRENT, mode
    try:
        yield mode
    finally:
        relay_mode.CURRENT = previous
