#!/usr/bin/env bash
# Run the three benchmarks on a CUDA machine that has no package index (the H200 device here).
# Wheels that machine lacks travel in .whl/ (megatron-core cp312, trl, datasets, dill, multiprocess):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform any -d .whl megatron-core==0.19.2 trl datasets dill multiprocess
# Usage: bash benchmarks/run_cuda.sh [rollout|weight_export|rl_step|kernel_profile ...]   (default: the first three)
# BENCH_ARGS goes to each script, BENCH_TIMEOUT (s) bounds each, BENCH_RESULTS_DIR=$OUT brings the JSONs back.
# Walls measured on the H200 (2026-12-06): rl_step ~220 s (ours, ours compiled, TRL; each --runs adds
# ~100 s), rollout --rl-sizes none ~118 s, each RL size with --skip-static ~150 s (HF static at 512 x 1024
# adds ~2 min), kernel_profile ~350 s (update 2 ways, decode 64 eager + compiled, 512 compiled). One device
# call is at most 600 s: run rollout alone, rl_step + weight_export in another.
# Rows that end early (compaction of finished rows; not yet run on a GPU, estimated ~2-3 min):
#   BENCH_ARGS="--rl-sizes none --skip-static --early-eos 256:1024:256" bash benchmarks/run_cuda.sh rollout
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
