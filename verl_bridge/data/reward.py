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
    """The run's reward function, checked (:mod:`verl_bridge.rewards.checked`): each call is limited to
    ``model.reward.args.timeout_s`` and must return a finite number, else an error names it."""
    from verl_bridge.rewards.checked import checked_reward

    r = config.model.reward
    if r.type == "function" and r.args.path:
        from verl_bridge.rewards import load_reward_fn
        from verl_bridge.rewards.loading import BUILTIN_REWARDS

        fn = load_reward_fn(r.args.path, config.source_dir)
        return checked_reward(fn, name=BUILTIN_REWARDS.get(r.args.path, r.args.path), timeout_s=r.args.timeout_s)
    if task is not None:
        return checked_reward(task.reward_fn, timeout_s=r.args.timeout_s)
    if r.type == "model":
        return None
    raise RewardError("no reward: set model.reward.args.path ('module:function') or a built-in data.task")
