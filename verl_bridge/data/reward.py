"""Which reward function scores the run's responses (``reward_fn(response, ground_truth) -> float``).

``model.reward.args.path`` (``"module:function"`` or a built-in name) when the reward is a
function; else the built-in task's own reward; None when a reward model scores
(:mod:`verl_bridge.placement.scorer`).
"""

from __future__ import annotations

from typing import Callable, Optional


class RewardError(RuntimeError):
    pass


def reward_function(config, task=None) -> Optional[Callable[[str, str], float]]:
    r = config.model.reward
    if r.type == "function" and r.args.path:
        from verl_bridge.rewards import load_reward_fn

        return load_reward_fn(r.args.path, config.source_dir)
    if task is not None:
        return task.reward_fn
    if r.type == "model":
        return None
    raise RewardError("no reward: set model.reward.args.path ('module:function') or a built-in data.task")
