"""4 gloo processes (one spawn, four runs): a reward model and a reward function on their own ranks
(actor on ranks 0-1 with TP=2, reward on ranks 2-3 with TP=2), a colocated reward model, and a
TP=1 layout where the actor (DP=2) and the reward (DP=2) each have two replicas."""

import json
import os

import pytest
import torch

from tests.dist_utils import run_distributed

QUICKSTART = "templates/quickstart.yaml"
STEPS = 3
COMMON = ["trainer.args.tp_size=2", "trainer.log_every=100", "trainer.progress_bar=false",
          "algorithm.name=grpo", "algorithm.group_size=2", "algorithm.kl.coef=0", "algorithm.ppo_epochs=1",
          "model.critic=null", "data.rollout_batch_size=8", "algorithm.mini_batch_size=16",
          "algorithm.micro_batch_size=8"]
MODEL = ["model.reward.type=model", "model.reward.args={preset: tiny, num_layers: 2, hidden_size: 64}"]


def _reset_parallel_state():
    from megatron.core import parallel_state as mpu

    from verl_bridge.distributed import set_data_parallel_group
    from verl_bridge.placement import groups

    mpu.destroy_model_parallel()
    set_data_parallel_group(None, None)
    groups.reset()


def _reward_model_run(out_dir):
    from verl_bridge.config import load_config
    from verl_bridge.placement.scorer import build_scorer
    from verl_bridge.runtime.trainer import MegatronTrainer

    cfg = load_config(QUICKSTART, COMMON + MODEL + [
        f"trainer.output_dir={out_dir}", f"trainer.total_steps={STEPS}",
        "model.reward.placement={ranks: 2, tp_size: 2, micro_batch_size: 4}"], world_size=4)
    trainer = MegatronTrainer(cfg)
    trainer.train()
    pl = trainer.placement
    if pl.is_reward_rank:
        return {"role": "reward", "served": pl.served, "dp": trainer.layout.dp_size}
    # colocated scoring of the same samples: the same reward model built on the actor's own ranks
    scorer = build_scorer(cfg, bridge=trainer.bridge, device=trainer.device, reward_fn=trainer.reward_fn,
                          tokenizer=trainer.tokenizer)
    local = [scorer(ids, mask, plen, None) for ids, mask, plen, _ in pl.scored]
    # plain lists: tensors shared through multiprocessing die with the worker process
    return {"role": "actor", "dp": trainer.layout.dp_size,
            "remote": [s.tolist() for *_, s in pl.scored], "local": [s.tolist() for s in local],
            "dtypes": [str(s.dtype) for *_, s in pl.scored], "rows": [ids.shape[0] for ids, *_ in pl.scored]}


def _reward_function_run():
    from verl_bridge.config import load_config
    from verl_bridge.runtime.trainer import MegatronTrainer

    cfg = load_config(QUICKSTART, COMMON + [
        "trainer.output_dir=null", "trainer.total_steps=2", "data.rollout_batch_size=6",
        "algorithm.mini_batch_size=12", "algorithm.micro_batch_size=6",
        "model.reward.placement={ranks: 2, tp_size: 2, micro_batch_size: 5}"], world_size=4)
    trainer = MegatronTrainer(cfg)
    history = trainer.train()
    pl = trainer.placement
    if pl.is_reward_rank:
        return {"role": "reward", "served": pl.served}
    # the trainer's colocated reward path on the same samples: decode, then the task's reward function
    _, truths = trainer.prompts.for_step(trainer.step, trainer.layout.dp_rank, trainer.layout.dp_size)
    remote, local = [], []
    for ids, mask, plen, scores in pl.scored:
        resp, m = ids[:, plen:], mask[:, plen:]
        texts = [trainer.tokenizer.decode(r[k.bool()].tolist()) for r, k in zip(resp, m)]
        local += [float(trainer.reward_fn(t, gt)) for t, gt in zip(texts, truths[len(remote):])]
        remote += scores.tolist()
    return {"role": "actor", "remote": remote, "local": local, "sizes": [s.shape[0] for *_, s in pl.scored],
            "history": history}


def _colocated_model_run():
    from verl_bridge.config import load_config
    from verl_bridge.runtime.trainer import MegatronTrainer

    cfg = load_config(QUICKSTART, COMMON + MODEL + ["trainer.output_dir=null", "trainer.total_steps=1"],
                      world_size=4)
    trainer = MegatronTrainer(cfg)
    (m,) = trainer.train()
    ((ids, mask, plen, scores),) = trainer.placement.scored
    return {"dp": trainer.layout.dp_size, "reward_mean": m["reward_mean"], "local_mean": float(scores.mean()),
            "std": float(scores.std()), "timings": sorted(trainer.placement.timings)}


def _actor_dp2_run():
    import hashlib

    from verl_bridge.config import load_config
    from verl_bridge.runtime.trainer import MegatronTrainer

    cfg = load_config(QUICKSTART, COMMON + MODEL + [
        "trainer.args.tp_size=1", "trainer.output_dir=null", "trainer.total_steps=2",
        "model.reward.placement={ranks: 2, tp_size: 1, micro_batch_size: 4}"], world_size=4)
    trainer = MegatronTrainer(cfg)
    history = trainer.train()
    pl = trainer.placement
    if pl.is_reward_rank:
        return {"role": "reward", "served": pl.served, "dp": trainer.layout.dp_size}
    flat = torch.cat([p.detach().flatten() for p in trainer.roles.actor.parameters()])
    return {"role": "actor", "dp": trainer.layout.dp_size, "dp_rank": trainer.layout.dp_rank,
            "weights": hashlib.md5(flat.numpy().tobytes()).hexdigest(), "steps": len(history),
            "samples": [ids.tolist() for ids, *_ in pl.scored]}


def _four_runs(rank, world_size, out_dir):
    out = {"model": _reward_model_run(out_dir)}
    _reset_parallel_state()
    out["function"] = _reward_function_run()
    _reset_parallel_state()
    out["colocated"] = _colocated_model_run()
    _reset_parallel_state()
    out["dp2"] = _actor_dp2_run()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("placed")
    return run_distributed(_four_runs, 4, str(out_dir), timeout=280), out_dir


def test_reward_model_on_its_own_ranks_overlaps_and_matches_colocated(runs):
    out, out_dir = runs
    out = [r["model"] for r in out]
    assert [r["role"] for r in out] == ["actor", "actor", "reward", "reward"]
    assert all(r["dp"] == 1 for r in out)  # the actor's DP group holds only its own replica
    # 8 prompts x 2 samples in micro-batches of 4: 4 per step, scored by both reward TP ranks
    assert out[2]["served"] == out[3]["served"] == 4 * STEPS
    a0, a1 = out[0], out[1]
    assert a0["rows"] == [4, 4, 4, 4] and a0["dtypes"] == ["torch.float32"] * 4
    for remote, local, remote1 in zip(a0["remote"], a0["local"], a1["remote"]):
        assert len(set(remote)) > 1  # a real model's scores, not a constant
        assert remote == local  # bit-exact (fp32) with colocated scoring of the same samples
        assert remote == remote1  # both actor TP ranks hold the scores
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
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


def test_reward_function_on_its_own_ranks_matches_colocated(runs):
    out = [r["function"] for r in runs[0]]
    assert [r["role"] for r in out] == ["actor", "actor", "reward", "reward"]
    assert out[2]["served"] == out[3]["served"] == 3 * 2  # 12 samples in micro-batches of 5, 5, 2
    actor = out[0]
    assert actor["sizes"] == [5, 5, 2]
    assert actor["remote"] == actor["local"] == out[1]["local"]
    assert len(actor["history"]) == 2


def test_colocated_reward_model_scores_the_whole_batch(runs):
    out = [r["colocated"] for r in runs[0]]
    assert all(r["dp"] == 2 for r in out)  # every rank is an actor rank again
    for r in out:
        assert r["std"] > 0 and abs(r["reward_mean"] - sum(x["local_mean"] for x in out[::2]) / 2) < 1e-6
        assert r["timings"] == ["time_reward_s", "time_reward_wait_s", "time_rollout_s"]


def test_actor_dp_group_excludes_the_reward_ranks(runs):
    out = [r["dp2"] for r in runs[0]]
    assert [(r["role"], r["dp"]) for r in out] == [("actor", 2), ("actor", 2), ("reward", 2), ("reward", 2)]
    assert [out[0]["dp_rank"], out[1]["dp_rank"]] == [0, 1]
    assert out[0]["samples"] != out[1]["samples"]  # each actor DP replica rolls out its own prompts
    # gradients all-reduced over the actor's DP group only: both replicas end with identical weights
    assert out[0]["steps"] == out[1]["steps"] == 2
    assert out[0]["weights"] == out[1]["weights"]
    # actor replica d sends to reward replica d: 8 samples each in micro-batches of 4, 2 steps
    assert out[2]["served"] == out[3]["served"] == 2 * 2
