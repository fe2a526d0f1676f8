#!/usr/bin/env bash
# CI tier: the CPU proofs on the newest megatron-core, 0.19.2 (Python >= 3.12; the main venv's
# Python 3.11 caps megatron-core at 0.16.1).
#
#   bash .ci/mcore_019_tier.sh [--install-only]
#
# Finds a Python >= 3.12 (MCORE019_PYTHON, pyenv's 3.12.x / 3.13.x through `pyenv prefix`, or a
# python3.12 / python3.13 / python3 on PATH that runs), builds or reuses its own venv
# (.venv-mcore019) with torch==2.13.0, megatron-core==0.19.2 and `-e '.[test]'`, then runs the
# tests below on 0.19.2. On PyPI torch 2.13.0 for Python 3.12 is the CUDA build (~100 s of
# download, ~4.8 GB in the venv; it runs on the CPU); pip's cache (PIP_CACHE_DIR, default
# ~/.cache/pip) keeps the wheels, so a rebuilt venv installs from disk.
# Without a Python >= 3.12 it prints one line saying what it skipped and exits 0.
# Measured on the 2-core CI machine: see the README's "megatron-core versions" table.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
# megatron-core >= 0.17 appends `git rev-parse --short HEAD` of its own folder to __version__; the
# venv lies inside this repo, so that would be verl-bridge's commit ("0.19.2+10c1c80"): switch it off
export NO_VCS_VERSION=1
VENV="${MCORE019_VENV:-.venv-mcore019}"
MCORE_VERSION="0.19.2"
TORCH_VERSION="2.13.0"
t0=$(date +%s)

# --- the tests this tier runs on megatron-core 0.19.2 ------------------------------------------
# run with -m "not slow" (the slow ones of these folders ran on 0.16.1 in the main tier; CI stays under 30 min)
TESTS=(
  tests/bridge        # bridge, version shims, Megatron-LM flags/flow, megatron.training on the CPU
  tests/checkpoint    # legacy + torch_dist, HF conversion (convert CLI), crash safety, Megatron-LM interop, no pickle
  tests/resharding    # weight export / verify / trainer hook, megatron.core.resharding.swap_model_weights
  tests/runtime/test_resume.py tests/runtime/test_portable_spec.py  # resume (both formats), GPT at TP=1 and TP=2
  tests/layout        # PP over gloo through megatron's schedules, SP norms, replicas, the stock local spec
  tests/runtime/test_fast_decode.py tests/runtime/test_fused_log_probs.py  # decoder vs module forward, the draw,
                      # compaction, memory passes; TP=1 log-probs without fp32 logits
  tests/runtime/test_decode_attention.py tests/runtime/test_compile_layers.py  # the Triton decode-attention kernel
                      # under TRITON_INTERPRET (this venv's CUDA torch ships triton); compiled layers == eager
)
# run whatever their markers: the CPU proofs issue 29 names
EXTRA_TESTS=(
  tests/runtime/test_learning.py::test_quickstart_ppo_learns  # the quickstart learning at TP=1
  tests/runtime/test_learning_tp2.py                          # ... and at TP=2 over gloo
  tests/layout/test_pp_equivalence.py                         # TP=2 x PP=2 x SP update == TP=1 x PP=1
  tests/layout/test_seed_run.py                               # the seed template's run: TP=2 x PP=2 x SP, HF critic, 2 rollout workers
  tests/runtime/test_moe.py                                   # MoE: EP=2 update == EP=1, routing replay, refusals
  tests/runtime/test_packing.py                               # dynamic batching: packed == padded (TP=1; TP=2 x SP x PP=2)
  tests/arch/test_moe_convert.py                              # MoE HF <-> megatron: bit-exact round trip, logits parity at EP=1 and EP=2
  tests/checkpoint/test_moe_convert_cli.py                    # verl-bridge convert --ep 2 both ways
  tests/runtime/test_moe_hf_actor.py                          # an HF Qwen2-MoE directory as the actor at EP=2
)
# -----------------------------------------------------------------------------------------------

py_ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; }
find_python() {
  local cand v
  if [ -n "${MCORE019_PYTHON:-}" ] && py_ok "$MCORE019_PYTHON"; then echo "$MCORE019_PYTHON"; return 0; fi
  if command -v pyenv >/dev/null 2>&1; then
    for v in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.1[2-9](\.[0-9]+)?$' | sort -V); do
      cand="$(pyenv prefix "$v" 2>/dev/null)/bin/python3"
      if py_ok "$cand"; then echo "$cand"; return 0; fi
    done
  fi
  for cand in python3.12 python3.13 python3; do
    if command -v "$cand" >/dev/null 2>&1 && py_ok "$(command -v "$cand")"; then command -v "$cand"; return 0; fi
  done
  return 1
}

ready() {
  "$VENV/bin/python" - "$MCORE_VERSION" "$TORCH_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
assert sys.version_info >= (3, 12)
assert version("megatron-core") == sys.argv[1] and version("torch").split("+")[0] == sys.argv[2]
import pytest, pytest_timeout, transformers, megatron.core  # noqa: F401
PY
}

if [ -x "$VENV/bin/python" ] && ready; then
  echo "mcore 0.19 tier: reusing $VENV"
else
  if ! PY="$(find_python)"; then
    echo "mcore 0.19 tier: SKIPPED, no Python >= 3.12 found (MCORE019_PYTHON, pyenv 3.12/3.13, python3.12," \
         "python3.13, python3), which megatron-core $MCORE_VERSION needs; not run on $MCORE_VERSION:" \
         "${TESTS[*]}${EXTRA_TESTS[*]+ ${EXTRA_TESTS[*]}}"
    exit 0
  fi
  echo "mcore 0.19 tier: building $VENV with $("$PY" -V 2>&1) ($PY): torch==$TORCH_VERSION megatron-core==$MCORE_VERSION"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  printf '*\n' > "$VENV/.gitignore"
  # --no-compile: byte-compiling the CUDA torch build costs minutes on 2 cores; the tests compile
  # the modules they import lazily
  "$VENV/bin/pip" install -q --no-compile "torch==$TORCH_VERSION" "megatron-core==$MCORE_VERSION" -e '.[test]'
fi
"$VENV/bin/pip" install -q --no-compile --no-deps -e .
"$VENV/bin/python" -c "import sys, torch, megatron.core as m; print(f'mcore 0.19 tier: python {sys.version.split()[0]}, torch {torch.__version__}, megatron-core {m.__version__}')"
t1=$(date +%s)
echo "mcore 0.19 tier: environment ready in $((t1 - t0)) s"
if [ "${1:-}" = "--install-only" ]; then exit 0; fi

"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m "not slow" "${TESTS[@]}"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "${EXTRA_TESTS[@]}"
echo "mcore 0.19 tier: tests took $(( $(date +%s) - t1 )) s, total $(( $(date +%s) - t0 )) s"
