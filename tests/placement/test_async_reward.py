"""4 gloo processes: the actor on ranks 0-1 (TP=2), a reward model on ranks 2-3 (TP=2), scored asynchronously."""

import json
import os

import torch

from tests.dist_utils import run_distributed

QUICKSTART = "templates/quickstart.yaml"
STEPS = 3


def _overrides(out_dir):
    return [
        "trainer.args.tp_size=2", f"trainer.output_dir={out_dir}", f"trainer.total_steps={STEPS}",
        "trainer.log_every=100", "trainer.progress_bar=false",
        "algorithm.name=grpo", "algorithm.group_size=2", "algorithm.kl.coef=0", "algorithm.ppo_epochs=1",
        "model.critic=null", "data.rollout_batch_size=8",
        "algorithm.mini_batch_size=16", "algorithm.micro_batch_size=8",
        "model.reward.type=model", "model.reward.args={preset: tiny, num_layers: 2, hidden_size: 64}",
        "model.reward.placement={ranks: 2, tp_size: 2, micro_batch_size: 4}",
    ]


def _train_placed(rank, world_size, out_dir):
    from verl_bridge.config import load_config
    from verl_bridge.placement.scorer import build_scorer
    from verl_bridge.runtime.trainer import MegatronTrainer

    cfg = load_config(QUICKSTART, _overrides(out_dir), world_size=world_size)
    trainer = MegatronTrainer(cfg)
    history = trainer.train()
    pl = trainer.placement
    if pl.is_reward_rank:
        return {"role": "reward", "served": pl.served, "dp": trainer.layout.dp_size}
    # colocated scoring of the same samples: the same reward model built on the actor's own ranks
    scorer = build_scorer(trainer)
    local = [scorer(ids, mask, plen, None) for ids, mask, plen, _ in pl.scored]
    # plain lists: tensors shared through multiprocessing die with the worker process
    return {"role": "actor", "history": history, "dp": trainer.layout.dp_size,
            "remote": [s.tolist() for *_, s in pl.scored], "local": [s.tolist() for s in local],
            "dtypes": [str(s.dtype) for *_, s in pl.scored], "rows": [ids.shape[0] for ids, *_ in pl.scored]}


def test_reward_model_on_its_own_ranks_overlaps_and_matches_colocated(tmp_path):
    out = run_distributed(_train_placed, 4, str(tmp_path), timeout=240)
    assert [r["role"] for r in out] == ["actor", "actor", "reward", "reward"]
    assert all(r["dp"] == 1 for r in out)  # the actor's DP group holds only its own replica
    # 8 prompts x 2 samples in micro-batches of 4: 4 per step, on both reward TP ranks
    assert out[2]["served"] == out[3]["served"] == 4 * STEPS
    a0, a1 = out[0], out[1]
    assert a0["rows"] == [4, 4, 4, 4]
    assert a0["dtypes"] == ["torch.float32"] * 4
    for remote, local, remote1 in zip(a0["remote"], a0["local"], a1["remote"]):
        assert len(set(remote)) > 1  # a real model's scores, not a constant
        assert remote == local  # bit-exact (fp32) with colocated scoring of the same samples
        assert remote == remote1  # both actor TP ranks hold the scores
    rows = [json.loads(line) for line in open(os.path.join(tmp_path, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        for k in ("time_rollout_s", "time_reward_s", "time_reward_wait_s", "time_train_s"):
            assert r[k] > 0, (k, r)
    reward = sum(r["time_reward_s"] for r in rows)
    wait = sum(r["time_reward_wait_s"] for r in rows)
    assert wait < reward, f"actor waited {wait:.4f}s for {reward:.4f}s of scoring: no overlap"
    # the logged reward is the reward model's score of the step's samples
    last = torch.tensor([x for part in a0["remote"] for x in part])
    assert abs(rows[-1]["reward_mean"] - float(last.mean())) < 1e-6
