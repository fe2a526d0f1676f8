#!/usr/bin/env bash
# The seed article's layout on a 4-GPU machine (issue 22, item 8): the same two runs that
# tests/layout/test_seed_run.py and the README quote on 4 CPU ranks over gloo, here over NCCL.
# NOT RUN YET: no machine with more than one GPU has been lent to this project; run it when one is.
#
#   1. templates/megatron_ppo.yaml: actor TP=2 x PP=2 with sequence parallelism (megatron-core's own
#      1F1B schedule, no CPU shims on CUDA), the Hugging Face critic, 2 rollout workers (generation
#      replicas, one per TP group, refilled by megatron.core.resharding.swap_model_weights over NCCL),
#      on a small OPT made locally (examples/seed_layout/make_opt.py, nothing downloaded), bf16 as the
#      template says; checks the article's log lines and that the reward rises.
#   2. templates/quickstart.yaml at TP=2 x PP=2 x SP: mean reward over the first five steps -> >= 0.8
#      over the last five.
#
# Usage:  bash tests/gpu/seed_layout_4gpu.sh [WORKDIR]      (exit 0: both passed; 1: a check failed;
#         2: not a 4-GPU machine or a run crashed). Env: PYTHON (default python3), STEPS (default 30).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
STEPS=${STEPS:-30}
WORK=${1:-$(mktemp -d -t seed4gpu.XXXXXX)}
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1  # no NVLink multicast (see the device notes)

n=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [ "$n" -lt 4 ]; then
  echo "seed_layout_4gpu: needs 4 CUDA devices, found $n"; exit 2
fi
mkdir -p "$WORK"
"$PY" examples/seed_layout/make_opt.py "$WORK/opt" || exit 2

# 1. the seed layout (the template's header, minus the CPU-only fp32 override: bf16 on the GPU)
"$PY" -m verl_bridge.cli train templates/megatron_ppo.yaml --nproc-per-node 4 \
  model.actor.args.model_name_or_path="$WORK/opt" model.critic.args.model_name_or_path="$WORK/opt" \
  data.task=repeat data.train_files=null data.max_prompt_length=8 data.max_response_length=4 \
  data.rollout_batch_size=64 trainer.total_steps="$STEPS" trainer.save_every=0 trainer.progress_bar=false \
  optim.actor.lr=1e-3 optim.critic.lr=3e-3 algorithm.ppo_epochs=4 algorithm.kl.coef=0.001 algorithm.kl.target=null algorithm.micro_batch_size=16 \
  trainer.output_dir="$WORK/seed" 2>&1 | tee "$WORK/seed.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "seed_layout_4gpu: the seed layout run failed"; exit 2; }

# 2. the quickstart at TP=2 x PP=2 x SP
"$PY" -m verl_bridge.cli train templates/quickstart.yaml --nproc-per-node 4 trainer.args.tp_size=2 \
  trainer.args.pp_size=2 trainer.args.sequence_parallel=true trainer.progress_bar=false \
  trainer.output_dir="$WORK/quickstart" 2>&1 | tee "$WORK/quickstart.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "seed_layout_4gpu: the quickstart run failed"; exit 2; }

"$PY" - "$WORK" "$STEPS" <<'PYEOF'
import json, sys
from pathlib import Path

work, steps = Path(sys.argv[1]), int(sys.argv[2])
ok = True
log = (work / "seed.log").read_text()
for line in ("[INFO] MegatronTrainer initialized with TP=2, PP=2, SP=True",
             f"[INFO] Actor model loaded from {work / 'opt'} (sharded across 4 ranks)",
             "[INFO] Rollout worker 0 started on ranks 0 & 1 (TP group)",
             "[INFO] Rollout worker 1 started on ranks 2 & 3 (TP group)",
             f"[INFO] Training step {steps}: loss="):
    if line not in log:
        print(f"MISSING log line: {line}"); ok = False


def means(run):
    rows = [json.loads(x) for x in (work / run / "metrics.jsonl").read_text().splitlines()]
    return sum(r["reward_mean"] for r in rows[:5]) / 5, sum(r["reward_mean"] for r in rows[-5:]) / 5


first, last = means("seed")
print(f"seed layout (TP=2 x PP=2 x SP, HF critic, 2 rollout workers): reward first5={first:.3f} last5={last:.3f}")
ok &= last - first >= 0.2
first, last = means("quickstart")
print(f"quickstart at TP=2 x PP=2 x SP: reward first5={first:.3f} last5={last:.3f}")
ok &= last >= 0.8
print("seed_layout_4gpu:", "PASSED" if ok else "FAILED")
sys.exit(0 if ok else 1)
PYEOF
