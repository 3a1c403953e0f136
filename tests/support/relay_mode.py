"""Which stream relay the sidecars that tests start use (`SidecarSettings.relay`).

`tests/sidecar/conftest.py` runs every sidecar test once per relay by setting `CURRENT`; other
suites keep `auto` (the C relay where it is built), as a deployed sidecar does.
"""

from __future__ import annotations

CURRENT = "auto"


def relay_under_test() -> str:
    return CURRENT
