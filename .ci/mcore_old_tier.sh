#!/usr/bin/env bash
# CI tier: the bridge tests against an older megatron-core (0.13.1) next to the main 0.16.1.
#
#   bash .ci/mcore_old_tier.sh            # after the main tier created .venv (or with /work/venv)
#
# Fast path (~10 s of install): .venv-mcore013 is an overlay venv whose own site-packages holds
# only megatron-core 0.13.1 (pip --target, so the base venv is never modified) and which reads
# everything else (torch 2.13.0, transformers, pytest, ...) from the base venv through a .pth
# file; its own site-packages comes first on sys.path, so `import megatron.core` is 0.13.1.
# Without a base venv it installs torch==2.13.0 megatron-core==0.13.1 and the test extras in full.
# Supported range and the version shims: verl_bridge/compat/mcore_versions.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
MCORE_OLD="${MCORE_OLD:-0.13.1}"
VENV=.venv-mcore013
start=$(date +%s)

base=""
for cand in "${MCORE_BASE_VENV:-}" .venv /work/venv; do
  if [ -n "$cand" ] && [ -x "$cand/bin/python" ] && "$cand/bin/python" -c "import torch, transformers, pytest" 2>/dev/null; then
    base="$(cd "$cand" && pwd)"
    break
  fi
done

want_ok() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c \
  "import megatron.core as m, sys; sys.exit(0 if m.__version__ == '$MCORE_OLD' else 1)" 2>/dev/null; }

if ! want_ok; then
  rm -rf "$VENV"
  if [ -n "$base" ]; then
    python3 -m venv --without-pip "$VENV"
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    base_site="$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$base/bin/pip" install -q --no-deps --target "$site" "megatron-core==$MCORE_OLD"
    echo "import site; site.addsitedir('$base_site')" > "$site/zz_base_venv.pth"
  else
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q torch==2.13.0 "megatron-core==$MCORE_OLD" -e '.[test]'
  fi
  printf '*\n' > "$VENV/.gitignore"
fi
"$VENV/bin/python" -c "import megatron.core as m; print('megatron-core', m.__version__, 'from', m.__file__)" 2>/dev/null
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/bridge
echo "mcore ${MCORE_OLD} tier: $(( $(date +%s) - start )) s including install"
