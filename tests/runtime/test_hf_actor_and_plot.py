"""An actor from a local HF directory carries the HF weights into training; `verl-bridge plot` draws a run."""

import json
import subprocess
import sys
from pathlib import Path

import torch

from tests.dist_utils import run_distributed

REPO = Path(__file__).resolve().parents[2]


def _actor_from_hf(rank, world_size, hf_dir, out):
    from tests.arch.tiny_hf import make_tiny_hf  # noqa: F401 (same helper as the conversion tests)
    from transformers import AutoModelForCausalLM

    from verl_bridge.config import load_config
    from verl_bridge.runtime.trainer import MegatronTrainer

    cfg = load_config("templates/grpo.yaml", [
        "model.actor.args.preset=null", f"model.actor.args.model_name_or_path={hf_dir}",
        f"trainer.output_dir={out}", "trainer.total_steps=2", "data.rollout_batch_size=4",
        "algorithm.group_size=4", "algorithm.mini_batch_size=16", "algorithm.micro_batch_size=8",
        "trainer.progress_bar=false"], world_size=world_size)
    trainer = MegatronTrainer(cfg)
    trainer.setup()
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = trainer.roles.actor(ids, torch.arange(12).unsqueeze(0).expand(2, -1), None)[..., :100]
        hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()(ids).logits
    diff = (ours - hf).abs().max().item()
    rows = [trainer.train_step(s) for s in (1, 2)]
    return diff, rows


def test_actor_initialised_from_hf_weights_trains(tmp_path):
    from tests.arch.tiny_hf import make_tiny_hf

    make_tiny_hf("llama", tmp_path / "llama")
    diff, rows = run_distributed(_actor_from_hf, 1, str(tmp_path / "llama"), str(tmp_path / "run"))[0]
    assert diff <= 1e-4, f"actor logits differ from transformers by {diff}"
    assert all(torch.isfinite(torch.tensor(r["actor_loss"])) for r in rows)


def test_plot_writes_png(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as f:
        for s in range(1, 6):
            f.write(json.dumps({"step": s, "reward_mean": s / 5, "kl": 0.1 * s, "actor_loss": -0.1, "critic_loss": 0.2,
                                "entropy": 2.0, "throughput_tokens_per_s": 1000.0 + s}) + "\n")
    r = subprocess.run([sys.executable, "-m", "verl_bridge.cli", "plot", str(run)], capture_output=True, text=True,
                       cwd=REPO)
    assert r.returncode == 0, r.stderr
    png = (run / "metrics.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    (run / "metrics.jsonl").write_text("{not json\n")
    r = subprocess.run([sys.executable, "-m", "verl_bridge.cli", "plot", str(run)], capture_output=True, text=True,
                       cwd=REPO)
    assert r.returncode == 1 and "metrics.jsonl:1: not a JSON object" in r.stderr
