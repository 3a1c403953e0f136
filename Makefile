# Entry points for people and CI. Each target sets up what it needs first.
.PHONY: setup demo test crds bench

setup:
	@bash scripts/bootstrap.sh

demo: setup
	.venv/bin/python scripts/demo.py

test: setup
	.venv/bin/python -m pytest

crds: setup
	.venv/bin/fleetwarden crds

bench: setup
	.venv/bin/python bench/operator_reconcile.py
