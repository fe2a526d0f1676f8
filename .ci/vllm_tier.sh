#!/usr/bin/env bash
# vLLM tier (CPU): load the resharded Megatron stream into vLLM's own model classes.
# Usage: bash .ci/vllm_tier.sh [--install-only]
# Creates or reuses .venv-vllm in the repo (vLLM pins its own torch, so it never shares the main
# venv), installs vLLM + megatron-core + pytest into it, then runs tests/vllm.
# Measured on the 2-core CI machine: see the README's vLLM section (install ~5 min, tests ~3 min).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
VENV="${VLLM_VENV:-.venv-vllm}"
VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
MCORE_VERSION="0.16.1"
t0=$(date +%s)
ready() {
  "$VENV/bin/python" - "$VLLM_VERSION" "$MCORE_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
assert version("vllm") == sys.argv[1] and version("megatron-core") == sys.argv[2]
import pytest, pytest_timeout  # noqa: F401
PY
}
if [ -x "$VENV/bin/python" ] && ready; then
  echo "vLLM tier: reusing $VENV (vllm $VLLM_VERSION)"
else
  echo "vLLM tier: installing vllm==$VLLM_VERSION into $VENV"
  python3 -m venv "$VENV"
  # one resolver run; --no-compile: byte-compiling ~8 GB of packages costs minutes on 2 cores,
  # and only the modules the tests import get compiled (lazily) anyway
  "$VENV/bin/pip" install -q --no-compile "vllm==$VLLM_VERSION" "megatron-core==$MCORE_VERSION" pytest pytest-timeout
fi
"$VENV/bin/pip" install -q --no-compile --no-deps -e .
"$VENV/bin/python" -c "import torch, vllm, verl_bridge; print(f'vLLM tier: vllm {vllm.__version__}, torch {torch.__version__}')"
t1=$(date +%s)
echo "vLLM tier: environment ready in $((t1 - t0)) s"
if [ "${1:-}" = "--install-only" ]; then exit 0; fi
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/vllm
echo "vLLM tier: tests took $(( $(date +%s) - t1 )) s, total $(( $(date +%s) - t0 )) s"
