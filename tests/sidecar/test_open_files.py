"""The sidecar raises its soft limit on open files to the hard one (`common.open_files`).

Each stream holds four descriptors while the C relay forwards it; at a runtime's default soft limit
of 1,024 a sidecar would stop accepting near 256 streams. Run in a child process: the limit is
process-wide and the test runner's own must not change.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

_CHILD = """
import json, resource, sys
from fleetwarden.common.open_files import raise_open_files_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), hard))
before_after = raise_open_files_limit()
print(json.dumps([before_after, resource.getrlimit(resource.RLIMIT_NOFILE)]))
"""


def _run(soft: int) -> tuple[list[int], list[int]]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(soft)], capture_output=True, text=True, check=True
    ).stdout
    before_after, limits = json.loads(out)
    return before_after, limits


_, HARD = resource.getrlimit(resource.RLIMIT_NOFILE)


@pytest.mark.skipif(
    HARD == resource.RLIM_INFINITY or HARD <= 256, reason="needs a finite hard limit above 256"
)
def test_a_low_soft_limit_is_raised_to_the_hard_one() -> None:
    (before, after), (soft, hard) = _run(256)
    assert (before, after) == (256, HARD)
    assert (soft, hard) == (HARD, HARD)


@pytest.mark.skipif(HARD == resource.RLIM_INFINITY, reason="needs a finite hard limit")
def test_a_soft_limit_at_the_hard_one_is_left_alone() -> None:
    (before, after), (soft, _) = _run(HARD)
    assert before == after == soft == HARD
