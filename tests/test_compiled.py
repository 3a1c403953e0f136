"""The guard against compiled modules that would shadow newer sources (fleetwarden/compiled.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetwarden.compiled import StaleCompiledModulesError, check_source_checkout, stale_extensions


def _tree(root: Path, *, extension_age_s: float) -> Path:
    """A checkout with sim/cluster.py and its compiled module, built `extension_age_s` before
    the source was last written (negative: after)."""
    package = root / "fleetwarden"
    (package / "sim").mkdir(parents=True)
    source = package / "sim" / "cluster.py"
    extension = package / "sim" / "cluster.cpython-311-x86_64-linux-gnu.so"
    source.write_text("")
    extension.write_bytes(b"")
    (package / "sim" / "routing.py").write_text("")  # pure: never reported
    written = source.stat().st_mtime
    os.utime(extension, (written - extension_age_s, written - extension_age_s))
    return package


def test_an_extension_older_than_its_source_is_stale(tmp_path: Path) -> None:
    package = _tree(tmp_path, extension_age_s=60)
    assert stale_extensions(package) == [
        package / "sim" / "cluster.cpython-311-x86_64-linux-gnu.so"
    ]


def test_an_extension_built_after_its_source_is_not(tmp_path: Path) -> None:
    assert stale_extensions(_tree(tmp_path, extension_age_s=-60)) == []


def test_a_checkout_with_stale_extensions_refuses_to_import(tmp_path: Path) -> None:
    package = _tree(tmp_path, extension_age_s=60)
    check_source_checkout(package)  # no pyproject.toml: an installed copy, not checked
    (tmp_path / "pyproject.toml").write_text("")
    with pytest.raises(StaleCompiledModulesError, match=r"fleetwarden/sim/cluster\.cpython"):
        check_source_checkout(package)


def test_a_machine_without_a_compiler_skips_the_compiled_pass_and_says_why(
    tmp_path: Path,
) -> None:
    """`scripts/build_compiled.sh` answers 3 (skip, `scripts/run_tests.sh`), not a failure, when
    setup.py falls back to pure Python for want of a compiler: a fresh machine without gcc must
    still pass `make test`. The compiler is made missing with CC; nothing is compiled."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "CC": "/nonexistent/cc", "COMPILED_TREE": str(tmp_path / "tree")}
    env["PYTHON"] = sys.executable
    done = subprocess.run(
        ["bash", "scripts/build_compiled.sh"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    assert "cannot compile: no C compiler (/nonexistent/cc not found)" in done.stderr
    assert (tmp_path / "tree" / "setup.py").exists()  # the copy was made where it was told
    assert not list((tmp_path / "tree" / "fleetwarden").rglob("*.so"))


@pytest.mark.parametrize("source", ["_fastrelay.c", "_fastrelay_wire.c", "_fastrelay.h"])
def test_the_c_relay_is_stale_when_any_of_its_sources_is_newer(tmp_path: Path, source: str) -> None:
    """The sidecar's C relay is built in editable installs too: an edit to any of its C sources
    must not leave the old build running silently."""
    sidecar = tmp_path / "fleetwarden" / "sidecar"
    sidecar.mkdir(parents=True)
    extension = sidecar / "_fastrelay.cpython-311-x86_64-linux-gnu.so"
    for name in ("_fastrelay.c", "_fastrelay_wire.c", "_fastrelay.h"):
        (sidecar / name).write_text("")
    extension.write_bytes(b"")
    written = (sidecar / source).stat().st_mtime
    for name in ("_fastrelay.c", "_fastrelay_wire.c", "_fastrelay.h"):
        os.utime(sidecar / name, (written - 120, written - 120))
    os.utime(extension, (written - 60, written - 60))
    assert stale_extensions(tmp_path / "fleetwarden") == []
    os.utime(sidecar / source, (written, written))
    assert stale_extensions(tmp_path / "fleetwarden") == [extension]
