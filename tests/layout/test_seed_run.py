"""The seed article's run, on CPU (issue 22, item 6): ``templates/megatron_ppo.yaml`` on 4 gloo ranks.

An OPT-shaped Hugging Face directory made locally (examples/seed_layout/make_opt.py, nothing
downloaded), then the CLI exactly as the template's header gives it: the actor at TP=2 x PP=2 with
sequence parallelism, the Hugging Face critic, 2 rollout workers (generation replicas, one per TP
group). Asserts the article's log lines and that the reward rises (measured on 0.16.1: first five
~0.08 -> last five ~0.6 over 30 steps).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# the CPU overrides the template's header documents (fp32, the toy task, short toy-run learning rates)
CPU_OVERRIDES = [
    "data.task=repeat", "data.train_files=null", "trainer.precision=fp32", "data.max_prompt_length=8",
    "data.max_response_length=4", "data.rollout_batch_size=64", "trainer.total_steps=30", "trainer.save_every=0",
    "optim.actor.lr=1e-3", "optim.critic.lr=3e-3", "algorithm.ppo_epochs=4", "algorithm.kl.coef=0.001",
    "algorithm.kl.target=null", "algorithm.micro_batch_size=16",
]


def test_header_documents_these_overrides():
    header = (REPO / "templates/megatron_ppo.yaml").read_text()
    for override in CPU_OVERRIDES:
        assert override in header, f"templates/megatron_ppo.yaml's header lacks {override}"


@pytest.mark.slow
def test_seed_layout_runs_on_four_cpu_ranks_and_learns(tmp_path):
    import megatron.core

    opt = tmp_path / "opt"
    subprocess.run([sys.executable, "examples/seed_layout/make_opt.py", str(opt)], cwd=REPO, check=True,
                   capture_output=True)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "verl_bridge.cli", "train", "templates/megatron_ppo.yaml", "--nproc-per-node", "4",
           f"model.actor.args.model_name_or_path={opt}", f"model.critic.args.model_name_or_path={opt}",
           *CPU_OVERRIDES, f"trainer.output_dir={run}", "trainer.progress_bar=false"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    for line in ("[INFO] MegatronTrainer initialized with TP=2, PP=2, SP=True",
                 f"[INFO] Actor model loaded from {opt} (sharded across 4 ranks)",
                 "[INFO] Rollout worker 0 started on ranks 0 & 1 (TP group)",
                 "[INFO] Rollout worker 1 started on ranks 2 & 3 (TP group)",
                 "[INFO] Training step 30: loss="):
        assert line in out, f"missing log line {line!r}:\n{out[-3000:]}"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, 31))
    first = sum(row["reward_mean"] for row in rows[:5]) / 5
    last = sum(row["reward_mean"] for row in rows[-5:]) / 5
    print(f"seed layout on megatron-core {megatron.core.__version__}: reward first5={first:.3f} last5={last:.3f}")
    assert last - first >= 0.2, f"reward first5={first:.3f} last5={last:.3f}"
