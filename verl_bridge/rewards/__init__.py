"""Rewards: built-in toy tasks a tiny model can learn from scratch on CPU, and user functions.

A reward function has the signature ``reward_fn(response: str, ground_truth: str) -> float``
(extra sample fields may be passed as keyword arguments when the function accepts them).
"""

from verl_bridge.rewards.toy import TASKS, ToyTask, ToyTokenizer, get_task  # noqa: F401
from verl_bridge.rewards.loading import load_reward_fn  # noqa: F401
