"""The evaluation stage: eval/* metrics at the right steps, greedy eval is deterministic, DP-exact means, plot panel."""

import json
import random
from pathlib import Path

import pytest

from tests.dist_utils import run_distributed

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "tests" / "data" / "gsm8k_sample.jsonl"


def _overrides(out, *extra):
    return ["data.task=sum", "data.max_response_length=2", f"trainer.output_dir={out}", "trainer.total_steps=3",
            "trainer.eval_every=2", "trainer.eval_before_train=true", "data.eval_samples=8",
            "data.rollout_batch_size=4", "algorithm.group_size=4", "algorithm.mini_batch_size=16",
            "algorithm.micro_batch_size=16", "trainer.progress_bar=false", "trainer.log_every=1", *extra]


def _train_with_eval(rank, world_size, out):
    import torch

    from verl_bridge.config import load_config
    from verl_bridge.rollout.base import SamplingParams
    from verl_bridge.rollout.producer import FunctionReward
    from verl_bridge.runtime.trainer import MegatronTrainer

    cfg = load_config(REPO / "templates" / "grpo.yaml", _overrides(out), world_size=world_size)
    trainer = MegatronTrainer(cfg)
    history = trainer.train()
    # greedy (eval_temperature 0): the same generations whatever the seed, hence the same metrics
    again = [trainer.evaluate(3), trainer.evaluate(4)]
    ids = [trainer.tokenizer.encode(p) for p, _ in trainer.eval_prompts()]
    params = SamplingParams(max_new_tokens=2, temperature=0.0, eos_token_id=14, pad_token_id=12)
    g1 = trainer.engine.generate(ids, params, seed=1).response_ids
    g2 = trainer.engine.generate(ids, params, seed=2).response_ids
    # scores that are not all 0/1: no accuracy
    trainer.producer.reward = FunctionReward(lambda response, truth: 0.5, trainer.tokenizer)
    non_binary = trainer.evaluate(3)
    training_streams = [trainer.task.sample(random.Random(cfg.trainer.seed * 1_000_003 + s), 8) for s in (1, 2, 3)]
    return dict(history=history, again=again, same_greedy=bool(torch.equal(g1, g2)), non_binary=non_binary,
                eval_prompts=trainer.eval_prompts(), training_streams=training_streams)


def test_eval_metrics_at_the_right_steps_and_plot(tmp_path):
    out = tmp_path / "run"
    res = run_distributed(_train_with_eval, 1, str(out))[0]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    eval_keys = {"eval/reward_mean", "eval/accuracy", "eval/response_length"}
    # step 0: the pre-training evaluation, an eval-only record
    assert eval_keys <= set(rows[0]) and "actor_loss" not in rows[0]
    assert not any(k.startswith("eval/") for k in rows[1])  # eval_every=2: not at step 1
    assert eval_keys <= set(rows[2]) and eval_keys <= set(rows[3])  # step 2, and the last step
    assert {"reward_mean", "actor_loss", "kl"} <= set(rows[2])  # merged into the training record
    for r in (rows[0], rows[2], rows[3]):
        assert 0.0 <= r["eval/accuracy"] <= 1.0
        # the sum task's reward is exact match (0/1): accuracy equals the mean reward
        assert abs(r["eval/accuracy"] - r["eval/reward_mean"]) < 1e-9
        assert 1.0 <= r["eval/response_length"] <= 2.0
    assert [h["step"] for h in res["history"]] == [0, 1, 2, 3]

    a, b = res["again"]
    assert res["same_greedy"]
    assert {k: v for k, v in a.items() if k != "eval/time_s"} == {k: v for k, v in b.items() if k != "eval/time_s"}
    assert a["eval/reward_mean"] == rows[3]["eval/reward_mean"]  # no update after step 3: same greedy result
    assert res["non_binary"]["eval/reward_mean"] == 0.5 and "eval/accuracy" not in res["non_binary"]
    # held-out stream: not any training step's sequence of prompts
    assert all(res["eval_prompts"] != s for s in res["training_streams"])

    # plot: an evaluation panel with both eval series; the CLI writes the PNG
    from verl_bridge.commands.plot import build_figure, read_metrics
    from verl_bridge.runtime.metrics import MetricsLogger

    fig = build_figure(read_metrics(str(out)))
    panels = {ax.get_title(): [ln.get_label() for ln in ax.lines] for ax in fig.axes if ax.get_visible()}
    assert panels["evaluation"] == ["eval/reward_mean", "eval/accuracy"]
    assert [ln.get_xdata().tolist() for ax in fig.axes if ax.get_title() == "evaluation" for ln in ax.lines][0] \
        == [0, 2, 3]
    assert "reward_mean" in panels["reward"]
    from click.testing import CliRunner

    from verl_bridge.commands.plot import plot

    r = CliRunner().invoke(plot, [str(out)])
    assert r.exit_code == 0, r.output
    assert (out / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    # resume bookkeeping keeps the step-0 eval record
    MetricsLogger(str(out), 3, True, False).truncate_after(1)
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1]


def test_plot_without_eval_keeps_four_panels():
    from verl_bridge.commands.plot import build_figure

    fig = build_figure([{"step": 1, "reward_mean": 0.1, "kl": 0.0, "actor_loss": 0.2, "throughput_tokens_per_s": 9}])
    assert [ax.get_title() for ax in fig.axes] == ["reward", "KL", "losses", "throughput (tokens/s)"]


def _eval_dp2(rank, world_size):
    from verl_bridge.config import load_config
    from verl_bridge.rollout.producer import FunctionReward
    from verl_bridge.runtime.trainer import MegatronTrainer

    cfg = load_config(REPO / "templates" / "grpo.yaml",
                      _overrides("null", "data.eval_samples=6", "algorithm.micro_batch_size=8"),
                      world_size=world_size)
    trainer = MegatronTrainer(cfg)
    trainer.setup()
    # each rank scores its own chunk with a reward that reveals which prompt it saw
    samples = trainer.eval_prompts()
    index = {p: i for i, (p, _) in enumerate(samples)}
    seen = []

    def reward(response, truth):
        seen.append(truth)
        return float(len(seen) == 1 and rank == 0)  # rank 0's first sample scores 1, all else 0

    trainer.producer.reward = FunctionReward(reward, trainer.tokenizer)
    return trainer.evaluate(1), len(seen), len(index)


def _two_rank_runs(rank, world_size):
    from megatron.core import parallel_state as mpu

    from verl_bridge.distributed import set_data_parallel_group

    out = {"dp2": _eval_dp2(rank, world_size)}
    mpu.destroy_model_parallel()
    set_data_parallel_group(None, None)
    out["placed"] = _eval_with_reward_group(rank, world_size)
    return out


@pytest.fixture(scope="module")
def two_rank_runs():
    return run_distributed(_two_rank_runs, 2)


def test_eval_is_exact_mean_over_dp_ranks(two_rank_runs):
    (m0, n0, _), (m1, n1, _) = (r["dp2"] for r in two_rank_runs)
    assert (n0, n1) == (3, 3)  # 6 prompts split across 2 DP ranks
    assert m0["eval/reward_mean"] == m1["eval/reward_mean"] == 1 / 6
    assert m0["eval/accuracy"] == 1 / 6


def test_eval_files_give_the_first_eval_samples_rows():
    from verl_bridge.config import load_config
    from verl_bridge.data.prompts import eval_samples
    from verl_bridge.runtime.evaluation import split_for_rank

    cfg = load_config(None, ["model.actor.args.preset=tiny", f"data.eval_files={SAMPLE}", "data.eval_samples=4",
                             "data.prompt_key=question", "trainer.eval_every=1"])
    samples = eval_samples(cfg, task=None)
    lines = [json.loads(x) for x in SAMPLE.read_text().splitlines()]
    assert [p for p, _ in samples] == [r["question"] for r in lines[:4]]
    assert samples[3][1].extra["index"] == 3
    assert [split_for_rank(list(range(7)), 3, r) for r in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]


def _eval_with_reward_group(rank, world_size):
    from verl_bridge.config import load_config
    from verl_bridge.rollout.producer import FunctionReward
    from verl_bridge.runtime.trainer import MegatronTrainer

    cfg = load_config(REPO / "templates" / "grpo.yaml", _overrides(
        "null", "trainer.total_steps=1", "trainer.eval_every=1", "model.reward.type=function",
        "model.reward.placement={ranks: 1, tp_size: 1}"),
        world_size=world_size)
    trainer = MegatronTrainer(cfg)
    history = trainer.train()
    if trainer.placement.is_reward_rank:
        return {"role": "reward", "served": trainer.placement.served}
    # the same evaluation scored here with the task's function: the model has not changed since step 1
    trainer.producer.reward = FunctionReward(trainer.reward_fn, trainer.tokenizer)
    return {"role": "actor", "history": history, "local": trainer.evaluate(1)}


def test_eval_scores_through_a_reward_group_on_its_own_ranks(two_rank_runs):
    actor, reward = (r["placed"] for r in two_rank_runs)
    assert (actor["role"], reward["role"]) == ("actor", "reward")
    # the reward rank scored the training batch and the evaluations of steps 0 and 1
    assert reward["served"] == 3  # one training micro-batch of 16 samples + two evaluations of 8
    steps = {h["step"]: h for h in actor["history"]}
    assert set(steps) == {0, 1}
    for k in ("eval/reward_mean", "eval/accuracy", "eval/response_length"):
        assert steps[1][k] == actor["local"][k], k
