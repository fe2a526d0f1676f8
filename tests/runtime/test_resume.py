"""A run resumed from a checkpoint continues the uninterrupted run's metrics exactly (CPU, fixed seed)."""

import json
import os

import pytest

from tests.dist_utils import run_distributed

KEYS = ("reward_mean", "kl", "actor_loss", "critic_loss", "entropy", "kl_coef")


def _run(rank, world_size, out, steps, fmt, extra):
    from verl_bridge.config import load_config
    from verl_bridge.runtime.trainer import MegatronTrainer

    cfg = load_config("templates/quickstart.yaml", [
        f"trainer.output_dir={out}", f"trainer.total_steps={steps}", "trainer.save_every=2",
        f"trainer.checkpoint_format={fmt}", "data.rollout_batch_size=32", "algorithm.mini_batch_size=16",
        "algorithm.micro_batch_size=16", "algorithm.kl.target=0.5", "algorithm.kl.horizon=100",
        "trainer.progress_bar=false", *extra], world_size=world_size)
    return MegatronTrainer(cfg).train()


def _rows(path):
    with open(os.path.join(path, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f]


@pytest.mark.parametrize("fmt", ["legacy", "torch_dist"])
def test_resumed_run_matches_uninterrupted(tmp_path, fmt):
    full = tmp_path / "full"
    run_distributed(_run, 1, str(full), 6, fmt, [])
    part = tmp_path / "part"
    run_distributed(_run, 1, str(part), 4, fmt, [])           # "crash" after step 4 (checkpoint at 4)
    assert (part / "checkpoints" / "actor" / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    history = run_distributed(_run, 1, str(part), 6, fmt, ["trainer.resume=auto"])[0]
    assert [h["step"] for h in history] == [5, 6]             # only the missing steps ran
    a, b = _rows(full), _rows(part)
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    for ra, rb in zip(a, b):
        for k in KEYS:
            assert ra[k] == pytest.approx(rb[k], rel=1e-6, abs=1e-7), (ra["step"], k, ra[k], rb[k])
