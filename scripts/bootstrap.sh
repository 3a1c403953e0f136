#!/usr/bin/env bash
# Sets up everything fleetwarden needs on a fresh Debian machine, idempotently:
#   1. Debian packages the tests start for real (listed in DEBIAN_PACKAGES), when missing;
#   2. a virtual environment in .venv with fleetwarden and its test extra.
# uv is used when it is available (or installable from PyPI); plain pip is the fallback.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_PACKAGES=(prometheus redis-server)   # real servers the tests start on 127.0.0.1

missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "bootstrap: installing Debian packages: ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "bootstrap: please install these Debian packages first: ${missing[*]}" >&2
    exit 1
  fi
fi

PYTHON=${PYTHON:-python3}
if ! command -v uv >/dev/null 2>&1; then
  "$PYTHON" -m pip install -q uv >/dev/null 2>&1 || true
fi
if command -v uv >/dev/null 2>&1; then
  [ -x .venv/bin/python ] || uv venv -q --python "$PYTHON" .venv
  VIRTUAL_ENV="$PWD/.venv" uv pip install -q -e '.[test]'
else
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test]'
fi
