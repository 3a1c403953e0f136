"""`native_stdout_to_stderr`: what native code writes to descriptor 1 leaves a command's stdout.

Real: a child Python process whose stdout and stderr are pipes (as under `| jq`), writing through
a buffered C stream and through raw `write(2)`. Nothing mocked.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import ctypes, os, sys
    from fleetwarden.cli.native_output import native_stdout_to_stderr

    libc = ctypes.CDLL(None)
    libc.fdopen.restype = ctypes.c_void_p
    native_out = libc.fdopen(1, b"w")  # a C stream on descriptor 1: fully buffered into a pipe
    print("before")
    with native_stdout_to_stderr():
        libc.fputs(b"banner from stdio\\n", ctypes.c_void_p(native_out))
        os.write(1, b"banner from write\\n")
    print('{"plan": 1}', flush=True)
    os.write(1, b"after\\n")
    """
)


def run_child() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True
    )


def test_native_writes_inside_the_block_go_to_stderr_and_stdout_keeps_its_order() -> None:
    done = run_child()
    assert done.stdout.splitlines() == ["before", '{"plan": 1}', "after"]
    assert "banner from stdio" in done.stderr
    assert "banner from write" in done.stderr


def test_a_closed_stdout_runs_the_block_unchanged() -> None:
    child = (
        "import os\n"
        "from fleetwarden.cli.native_output import native_stdout_to_stderr\n"
        "os.close(1)\n"
        "with native_stdout_to_stderr():\n"
        "    ran = True\n"
        "import sys\n"
        "sys.stderr.write('ran' if ran else 'not')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stderr.endswith("ran")
