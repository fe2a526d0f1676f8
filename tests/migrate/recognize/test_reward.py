"""reward.py: the reward function is found by where its results go, not only by its name."""

from .helpers import GRPO, recognizer


def test_reward_by_name():
    r = recognizer(GRPO)
    assert r.a.config["model.reward.args.path"] == "t:reward_fn"


def test_reward_by_data_flow():
    r = recognizer(GRPO.replace("reward_fn", "exact_match"))
    assert r.a.config["model.reward.args.path"] == "t:exact_match"


def test_inline_reward_gets_a_todo():
    r = recognizer(GRPO.replace("torch.tensor([reward_fn(t, a) for t, a in pairs(out)])", "score_model(out)"))
    assert "model.reward.args.path" not in r.a.config and r.a.reward_todo
