#!/usr/bin/env bash
# `make test`: the whole suite on the tree as it is (pure Python), then the simulator's and
# replay's tests (tests/sim) again on a copy whose simulator hot modules are compiled by mypyc
# (setup.py; wheels and `pip install .` ship that build). The copy is built at low priority while
# the main suite runs, so on two cores it costs little wall time.
#
# Where the machine cannot compile (no C compiler or Python headers: setup.py then installs pure
# Python), the compiled pass is skipped and says why; a compile error fails the run. Arguments go
# to the main pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
nice -n 10 bash scripts/build_compiled.sh >build/compiled.log 2>&1 &
builder=$!

.venv/bin/python -m pytest "$@"
suite=$?

wait "$builder"
built=$?
compiled=0
if [ "$built" -eq 0 ]; then
  echo "run_tests: tests/sim on the compiled build: $(tail -n 1 build/compiled.log)"
  (cd build/compiled && ../../.venv/bin/python -m pytest tests/sim -q -p no:cacheprovider)
  compiled=$?
elif [ "$built" -eq 3 ]; then
  echo "run_tests: SKIPPED the compiled pass: $(tail -n 1 build/compiled.log)"
else
  cat build/compiled.log >&2
  echo "run_tests: FAILED to build the compiled copy (log above)" >&2
  compiled=1
fi
[ "$suite" -eq 0 ] && [ "$compiled" -eq 0 ]
