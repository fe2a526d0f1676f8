#!/usr/bin/env bash
# CI tier: cross-check verl_bridge.algorithms against verl 0.9.1's verl.trainer.ppo.core_algos on
# random inputs (tests marked `verl`, tests/algorithms/test_verl_crosscheck.py; the main tier skips them).
#
#   bash .ci/verl_tier.sh [--install-only]
#
# .venv-verl holds torch==2.13.0 (the local CPU wheel, installed first so nothing pulls another
# torch), verl==0.9.1 with --no-deps, and only the packages `import verl.trainer.ppo.core_algos`
# needs (measured: verl/__init__ imports packaging, ray, tensordict, transformers, codetiming,
# orjson; core_algos itself numpy and omegaconf), pinned to verl's own ranges where it states one.
# verl's other requirements (datasets, peft, wandb, vllm, ...) are never imported by core_algos.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
VENV="${VERL_VENV:-.venv-verl}"
VERL_VERSION=0.9.1
t0=$(date +%s)
ready() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$VERL_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
assert version("verl") == sys.argv[1] and version("torch").startswith("2.13.0")
import pytest, pytest_timeout, verl.trainer.ppo.core_algos  # noqa: F401
PY
}
if ready; then
  echo "verl tier: reusing $VENV (verl $VERL_VERSION)"
else
  echo "verl tier: installing verl==$VERL_VERSION into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch==2.13.0
  "$VENV/bin/pip" install -q --no-deps "verl==$VERL_VERSION"
  # torch==2.13.0 repeated so that no requirement below can replace it
  "$VENV/bin/pip" install -q torch==2.13.0 numpy omegaconf packaging codetiming orjson ray \
    "tensordict>=0.8.0,<=0.10.0,!=0.9.0" "transformers>=5.5.3,<5.11,!=5.6.0" pytest pytest-timeout
  printf '*\n' > "$VENV/.gitignore"
fi
"$VENV/bin/pip" install -q --no-deps -e .
t1=$(date +%s)
echo "verl tier: environment ready in $((t1 - t0)) s"
if [ "${1:-}" = "--install-only" ]; then exit 0; fi
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m verl tests/algorithms
echo "verl tier: tests took $(( $(date +%s) - t1 )) s, total $(( $(date +%s) - t0 )) s"
