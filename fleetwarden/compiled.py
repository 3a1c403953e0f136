"""Which fleetwarden modules run compiled (mypyc, see setup.py), and a guard against stale ones.

Python imports an extension module before a .py file of the same name, so a module compiled in
place and edited afterwards would silently run its old code. Editable installs never compile
mypyc modules (setup.py; they do build the sidecar's C relay, from a .c source), but a manual in-place build (`setup.py build_ext --inplace`, the `mypyc` command)
can leave such files behind; in a source checkout, importing fleetwarden then fails with the list
of stale files instead. Installed wheels are not checked: nobody edits them.
"""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
EXTENSION_GLOBS = ("*.so", "*.pyd")


class StaleCompiledModulesError(ImportError):
    """Compiled modules older than their source, which would run instead of it."""


def stale_extensions(package: Path) -> list[Path]:
    """Extension modules under `package` with a source modified after they were built: a mypyc
    module's .py, or the C sources of the sidecar's relay (`<name>.c`, `<name>_*.c`, `<name>.h`)."""
    stale = []
    for pattern in EXTENSION_GLOBS:
        for extension in package.rglob(pattern):
            stem = extension.name.split(".", 1)[0]
            built = extension.stat().st_mtime
            sources = [extension.with_name(stem + suffix) for suffix in (".py", ".c", ".h")]
            sources += extension.parent.glob(stem + "_*.c")
            if any(source.exists() and source.stat().st_mtime > built for source in sources):
                stale.append(extension)
    return sorted(stale)


def check_source_checkout(package: Path = PACKAGE) -> None:
    """Refuse to run stale compiled modules in a source checkout (a pyproject.toml next to the
    package); a no-op for installed copies."""
    if not (package.parent / "pyproject.toml").exists():
        return
    stale = stale_extensions(package)
    if stale:
        listed = "\n  ".join(str(path.relative_to(package.parent)) for path in stale)
        raise StaleCompiledModulesError(
            "fleetwarden: these compiled modules are older than their .py source and would run "
            f"instead of it:\n  {listed}\nRebuild the C relay (`make setup`) and delete the others "
            "(`make clean-compiled`): mypyc builds belong in wheels or in `make compiled` "
            "(build/compiled), not in the tree you edit."
        )


def compiled_modules() -> list[str]:
    """The fleetwarden modules imported so far that run mypyc-compiled (the C relay, which has
    no Python twin, is not one of them)."""
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith("fleetwarden.")
        and name != "fleetwarden.sidecar._fastrelay"
        and not str(getattr(module, "__file__", None) or ".py").endswith(".py")
    )
