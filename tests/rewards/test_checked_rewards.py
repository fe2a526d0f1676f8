"""Reward functions are checked where rewards are produced: an exception, a hang past
``model.reward.args.timeout_s``, NaN, inf, a list, None or a string is an error naming
``module:function``, the sample index and the value (not a NaN loss blamed on the learning rate)."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from verl_bridge.config import load_config
from verl_bridge.data.reward import reward_function
from verl_bridge.rewards.checked import RewardFunctionError

REPO = Path(__file__).resolve().parents[2]

MODULE = textwrap.dedent("""\
    import math, threading

    def _bad_on_second(value):
        def fn(response, ground_truth):
            return value if response == "second" else 1.0
        return fn

    def raises(response, ground_truth):
        if response == "second":
            raise KeyError("answer")
        return 0.5
    returns_nan = _bad_on_second(math.nan)
    returns_inf = _bad_on_second(-math.inf)
    returns_list = _bad_on_second([1.0, 2.0])
    returns_none = _bad_on_second(None)
    returns_str = _bad_on_second("0.5")
    STOP = threading.Event()
    def hangs(response, ground_truth):
        if response == "second":
            STOP.wait(60)
        return 1.0
    def fine(response, ground_truth, extra=None):
        return len(response) % 2
""")


@pytest.fixture
def rewards_dir(tmp_path):
    (tmp_path / "my_rewards.py").write_text(MODULE)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("model: {actor: {args: {preset: tiny}}, reward: {type: function}}\n")
    yield tmp_path
    sys.modules.pop("my_rewards", None)


def _reward(rewards_dir, name, *overrides):
    cfg = load_config(rewards_dir / "cfg.yaml", [f"model.reward.args.path=my_rewards:{name}", *overrides])
    return reward_function(cfg)


@pytest.mark.parametrize("name,shown", [
    ("raises", "raised KeyError: 'answer'"), ("returns_nan", "returned nan"), ("returns_inf", "returned -inf"),
    ("returns_list", "returned [1.0, 2.0] (list)"), ("returns_none", "returned None (NoneType)"),
    ("returns_str", "returned '0.5' (str)"),
])
def test_bad_values_name_function_sample_and_value(rewards_dir, name, shown):
    fn = _reward(rewards_dir, name)
    with pytest.raises(RewardFunctionError) as e:
        fn.score(["first", "second", "third"], ["a", "b", "c"])
    msg = str(e.value)
    assert f"reward function my_rewards:{name} on sample 1 (response 'second')" in msg, msg
    assert shown in msg, msg
    assert "lr" not in msg


def test_hang_times_out_naming_function(rewards_dir):
    fn = _reward(rewards_dir, "hangs", "model.reward.args.timeout_s=0.5")
    t0 = time.perf_counter()
    with pytest.raises(RewardFunctionError) as e:
        fn.score(["first", "second"], ["a", "b"])
    assert time.perf_counter() - t0 < 5
    assert "my_rewards:hangs on sample 1" in str(e.value)
    assert "model.reward.args.timeout_s=0.5 s" in str(e.value)
    sys.modules["my_rewards"].STOP.set()  # let the abandoned worker thread finish
    assert fn.score(["first"], ["a"]) == [1.0]  # a fresh worker after the stuck one


def test_good_values_pass_through(rewards_dir):
    import numpy as np
    import torch

    fn = _reward(rewards_dir, "fine")
    assert fn.score(["ab", "abc"], ["x", "y"]) == [0.0, 1.0]
    from verl_bridge.rewards.checked import checked_reward

    assert checked_reward(lambda r, g: np.float32(0.25)).score(["x"], ["y"]) == [0.25]
    assert checked_reward(lambda r, g: torch.tensor(2.0)).score(["x"], ["y"]) == [2.0]
    assert checked_reward(lambda r, g: True).score(["x"], ["y"]) == [1.0]


def test_timeout_key_is_validated(rewards_dir):
    from verl_bridge.config import ConfigError

    with pytest.raises(ConfigError, match=r"model.reward.args.timeout_s=-1.0: out of range"):
        _reward(rewards_dir, "fine", "model.reward.args.timeout_s=-1")


def test_training_with_nan_reward_names_the_function(rewards_dir):
    """End to end: ``verl-bridge train`` with a reward returning NaN stops at step 1, exit 2, naming it."""
    (rewards_dir / "nan_rewards.py").write_text(
        "import math\ndef score(response, ground_truth):\n    return math.nan\n")
    r = subprocess.run(
        [sys.executable, "-m", "verl_bridge.cli", "train", str(REPO / "templates/quickstart.yaml"),
         f"trainer.output_dir={rewards_dir / 'run'}", "trainer.total_steps=2", "data.rollout_batch_size=4",
         "algorithm.mini_batch_size=4", "algorithm.micro_batch_size=4", "algorithm.ppo_epochs=1",
         "trainer.progress_bar=false", f"model.reward.args.path=nan_rewards:score"],
        capture_output=True, text=True, timeout=300, cwd=rewards_dir)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "reward function nan_rewards:score on sample 0" in out and "returned nan" in out, out
    assert "lower optim.actor.lr" not in out and "Traceback" not in out
