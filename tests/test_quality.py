"""Quality gates run as tests, so the one test command in the README checks everything.

Each gate runs the real tool on the whole tree; a failure prints the tool's own report.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.parametrize(
    "command",
    [
        ("ruff", "check", "."),
        ("ruff", "format", "--check", "."),
        ("mypy", "--strict", "fleetwarden"),
        ("lint-imports",),
    ],
    ids=lambda c: " ".join(c),
)
def test_quality_gate(command: tuple[str, ...]) -> None:
    result = _run(str(BIN / command[0]), *command[1:])
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}"


def test_modules_stay_small() -> None:
    """Small modules with one purpose each; 500 lines is the agreed ceiling."""
    too_long = {
        str(path.relative_to(ROOT)): n
        for path in (ROOT / "fleetwarden").rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 500
    }
    assert not too_long, too_long


def test_pure_cores_never_read_the_clock() -> None:
    """import-linter forbids importing `time`; this also catches `datetime.now()` and friends."""
    offenders = []
    for package in ("fairness", "scaling"):
        for path in (ROOT / "fleetwarden" / package).rglob("*.py"):
            text = path.read_text()
            for needle in ("datetime.now", "datetime.utcnow", "date.today", "random.random("):
                if needle in text:
                    offenders.append(f"{path.relative_to(ROOT)}: {needle}")
    assert not offenders, offenders
