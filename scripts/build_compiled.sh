#!/usr/bin/env bash
# Builds build/compiled: a copy of the working tree (tracked and new files, as they are now) with
# the simulator's hot modules compiled in place by mypyc (setup.py), for `make test` (its compiled
# pass), `make test-compiled` and `make bench-compiled`. The tree you edit stays pure Python; the
# copy is made afresh every time, so it never lags behind your edits (nothing to edit there:
# changes are lost on the next build).
#
# Exit status: 0 built; 3 this machine cannot compile (no C compiler or Python headers; the last
# line says which); anything else a failed build, with mypyc's or the compiler's log.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")"  # absolute, venv kept
TREE=${COMPILED_TREE:-build/compiled}  # COMPILED_TREE: another place (the tests use one)

rm -rf "$TREE"
mkdir -p "$TREE"
git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' path; do [ -f "$path" ] && printf '%s\0' "$path"; done \
  | tar --null -T - -cf - | tar -xf - -C "$TREE"
cd "$TREE"
started=$SECONDS
FLEETWARDEN_PURE_PYTHON= "$PYTHON" setup.py -q build_ext --inplace -j 2 >build.log 2>&1 \
  || { cat build.log >&2; echo "build_compiled: mypyc build failed (log above)" >&2; exit 1; }
if ! ls fleetwarden/sim/cluster.*.so >/dev/null 2>&1; then
  reason=$(grep -o "pure Python build: .*" build.log || true)
  if [[ $reason == *"no C compiler"* || $reason == *"no Python headers"* ]]; then
    echo "build_compiled: this machine cannot compile: ${reason#pure Python build: }" >&2
    exit 3
  fi
  cat build.log >&2
  echo "build_compiled: nothing was compiled (log above)" >&2
  exit 1
fi
echo "build_compiled: $TREE compiled in $((SECONDS - started)) s" >&2
