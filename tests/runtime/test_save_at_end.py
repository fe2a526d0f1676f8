"""``trainer.save_every: 0`` saves once, at the end; the rollout worker (N / t = 1 here, derived) is logged."""

import contextlib
import io

from tests.dist_utils import run_distributed


def _train(rank, world_size, out):
    from verl_bridge.config import load_config
    from verl_bridge.runtime.trainer import MegatronTrainer

    cfg = load_config("templates/quickstart.yaml", [
        f"trainer.output_dir={out}", "trainer.total_steps=3", "trainer.save_every=0", "trainer.progress_bar=false",
        "data.rollout_batch_size=8", "algorithm.mini_batch_size=8",
        "algorithm.micro_batch_size=8", "algorithm.ppo_epochs=1"], world_size=world_size)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        history = MegatronTrainer(cfg).train()
    return [h["step"] for h in history], printed.getvalue()


def test_save_every_zero_saves_at_the_end_and_logs_the_rollout_worker(tmp_path):
    steps, printed = run_distributed(_train, 1, str(tmp_path))[0]
    assert steps == [1, 2, 3]
    actor = tmp_path / "checkpoints" / "actor"
    assert (actor / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert sorted(p.name for p in actor.iterdir() if p.name.startswith("iter_")) == ["iter_0000003"]
    assert (tmp_path / "checkpoints" / "critic" / "iter_0000003").is_dir()
    assert "[INFO] Rollout worker 0 started on rank 0\n" in printed
