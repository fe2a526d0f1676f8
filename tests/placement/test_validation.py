"""Placement validation (no processes): every problem listed, each naming key, value and what is allowed."""

import pytest

from verl_bridge.commands.plan_text import parallel_plan
from verl_bridge.config import ConfigError, load_config

QUICKSTART = "templates/quickstart.yaml"
BASE = ["trainer.args.tp_size=2", "algorithm.name=grpo", "algorithm.group_size=2", "model.critic=null",
        "data.rollout_batch_size=8", "algorithm.mini_batch_size=16", "algorithm.micro_batch_size=8",
        "model.reward.type=model", "model.reward.args={preset: tiny}"]


def _problems(overrides, world_size=4):
    with pytest.raises(ConfigError) as exc:
        load_config(QUICKSTART, BASE + overrides, world_size=world_size)
    return exc.value.problems


def test_good_placement_loads_and_defaults_to_colocated():
    cfg = load_config(QUICKSTART, BASE + ["model.reward.placement={ranks: 2, tp_size: 2}"], world_size=4)
    assert cfg.model.reward.placement == {"ranks": 2, "tp_size": 2}
    assert load_config(QUICKSTART, BASE, world_size=4).model.reward.placement == "colocated"


def test_reward_group_must_leave_ranks_for_the_actor():
    (p,) = _problems(["model.reward.placement={ranks: 4, tp_size: 2}"])
    assert p.startswith("model.reward.placement.ranks=4:") and "at least one rank left for the actor" in p
    assert "allowed: 1 .. 3 with world size 4" in p


def test_every_problem_is_listed_at_once():
    problems = _problems(["model.reward.placement={ranks: 3, tp_size: 2, colour: red}",
                          "model.critic.placement={ranks: 1}", "trainer.save_every=5"])
    text = "\n".join(problems)
    assert "model.critic.placement={'ranks': 1}: only model.reward can run on its own ranks" in text
    assert "allowed: colocated" in text
    assert "model.reward.placement.colour: unknown key; allowed keys here: ranks, tp_size, micro_batch_size" in text
    assert "model.reward.placement.tp_size=2 does not divide its group of model.reward.placement.ranks=3 ranks" in text
    assert "trainer.save_every=5: checkpoints are not saved with a separate reward group" in text
    # the actor is left 1 rank, which TP=2 cannot split: the parallel arithmetic reports it too
    assert "trainer.args.tp_size=2 does not divide world size 1" in text


def test_reward_tp_must_equal_actor_tp_and_pp_must_be_one():
    problems = _problems(["model.reward.placement={ranks: 2, tp_size: 1}", "trainer.args.pp_size=2"], world_size=8)
    text = "\n".join(problems)
    assert "model.reward.placement.tp_size=1: must equal trainer.args.tp_size=2 in this version" in text
    assert "a separate reward group needs trainer.args.pp_size=1 (got 2)" in text


@pytest.mark.parametrize("value, expected", [
    ("fast", "model.reward.placement='fast': expected 'colocated' or a mapping {ranks: N, tp_size: T}"),
    ("{ranks: 0, tp_size: 2}", "model.reward.placement.ranks=0: expected an integer >= 1"),
    ("{tp_size: 2}", "model.reward.placement: a separate placement needs ranks"),
])
def test_malformed_placement(value, expected):
    problems = _problems([f"model.reward.placement={value}"])
    assert any(p.startswith(expected) for p in problems), problems


def test_actor_arithmetic_uses_the_ranks_left_by_the_reward():
    # 8 prompts x 2 = 16 samples over the actor's dp: world 6 - 2 reward ranks = 4 actor ranks / TP 2 = dp 2
    cfg = load_config(QUICKSTART, BASE + ["model.reward.placement={ranks: 2, tp_size: 2}"], world_size=6)
    # dp 3 (6 / TP 2) would not divide 8 prompts; the actor's dp of 2 does
    with pytest.raises(ConfigError):
        load_config(QUICKSTART, BASE, world_size=6)
    lines = parallel_plan(cfg, 6, has_cuda=False)
    assert "parallelism     TP=2 PP=1 DP=2 SP=False" in lines


def test_dry_run_prints_the_layout():
    cfg = load_config(QUICKSTART, BASE + ["model.reward.placement={ranks: 2, tp_size: 2, micro_batch_size: 4}"],
                      world_size=4)
    lines = parallel_plan(cfg, 4, has_cuda=False)
    text = "\n".join(lines)
    assert "placement       actor, reference: ranks 0-1  TP=2 PP=1 DP=1" in text
    assert "reward (model): ranks 2-3  TP=2 PP=1 DP=1; scored asynchronously in micro-batches of 4" in text
    assert "rank 1: actor  tp_rank=1 dp_rank=0" in text
    assert "rank 2: reward tp_rank=0 dp_rank=0" in text
    assert "rank 3: reward tp_rank=1 dp_rank=0" in text
    colocated = parallel_plan(load_config(QUICKSTART, BASE, world_size=4), 4, has_cuda=False)
    assert "placement       actor, reference, reward (model): ranks 0-3  TP=2 PP=1 DP=2" in colocated
