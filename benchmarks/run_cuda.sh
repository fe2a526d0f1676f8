#!/usr/bin/env bash
# Run the three benchmarks on a CUDA machine that has no package index (the H200 device here).
# Wheels that machine lacks travel in .whl/ (megatron-core cp312, trl, datasets, dill, multiprocess):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform any -d .whl megatron-core==0.19.2 trl datasets dill multiprocess
# Usage: bash benchmarks/run_cuda.sh [rollout|weight_export|rl_step ...]   (default: all three)
set -uo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
names=("$@"); [ ${#names[@]} -eq 0 ] && names=(rollout weight_export rl_step)
rc=0
for n in "${names[@]}"; do
  echo "=== $n $(date -u +%T)"
  timeout "${BENCH_TIMEOUT:-400}" python3 "benchmarks/$n.py" ${BENCH_ARGS:-} || { echo "!!! $n exited $?"; rc=1; }
done
exit $rc
