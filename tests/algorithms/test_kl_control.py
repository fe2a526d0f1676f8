"""KL controllers (fixed / adaptive arithmetic, state round trip) and the KL-in-reward penalty."""

import math

import pytest
import torch

from verl_bridge.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_to_rewards,
    build_kl_controller,
)


def test_fixed_controller_never_moves():
    ctl = FixedKLController(0.05)
    ctl.update(current_kl=100.0, n_steps=1000)
    assert ctl.value == 0.05
    other = FixedKLController(1.0)
    other.load_state_dict(ctl.state_dict())
    assert other.value == 0.05


def test_adaptive_controller_arithmetic():
    ctl = AdaptiveKLController(init_kl_coef=0.1, target=6.0, horizon=10000)
    # kl 12 -> error 12/6 - 1 = 1, clipped to 0.2 -> value *= 1 + 0.2 * 256 / 10000
    ctl.update(current_kl=12.0, n_steps=256)
    v1 = 0.1 * 1.00512
    assert ctl.value == pytest.approx(v1)
    # kl 3 -> error -0.5, clipped to -0.2 -> value *= 1 - 0.00512
    ctl.update(current_kl=3.0, n_steps=256)
    v2 = v1 * 0.99488
    assert ctl.value == pytest.approx(v2)
    # kl 6.6 -> error 0.1 (inside the clip) -> value *= 1 + 0.1 * 1000 / 10000
    ctl.update(current_kl=6.6, n_steps=1000)
    assert ctl.value == pytest.approx(v2 * 1.01)
    # on target: no change
    before = ctl.value
    ctl.update(current_kl=6.0, n_steps=1000)
    assert ctl.value == pytest.approx(before)


def test_adaptive_state_round_trip_and_type_check():
    ctl = AdaptiveKLController(0.2, target=1.0, horizon=100)
    ctl.update(2.0, 10)  # 0.2 * 1.02
    restored = AdaptiveKLController(0.2, target=1.0, horizon=100)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value == pytest.approx(0.204)
    restored.update(2.0, 10)
    assert restored.value == pytest.approx(0.204 * 1.02)
    with pytest.raises(ValueError, match="fixed"):
        restored.load_state_dict(FixedKLController(0.1).state_dict())


def test_build_kl_controller():
    fixed = build_kl_controller(0.01)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.01
    adaptive = build_kl_controller(0.01, target=6.0)
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.target, adaptive.horizon) == (6.0, 10000)
    assert build_kl_controller(0.01, target=6.0, horizon=500).horizon == 500
    with pytest.raises(ValueError, match="target must be > 0"):
        build_kl_controller(0.01, target=0.0)
    with pytest.raises(ValueError, match="horizon must be > 0"):
        build_kl_controller(0.01, target=1.0, horizon=0)
    with pytest.raises(ValueError, match=">= 0"):
        build_kl_controller(-0.1)


def test_apply_kl_to_rewards_k1_by_hand():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
    ref = torch.zeros(3, 4)
    # k1 = log_prob - ref: row 0 -> .2 .4 .6, row 1 -> .1 ; padding holds -inf log-probs
    log_prob = torch.tensor([[0.2, 0.4, 0.6, -math.inf], [0.1, -math.inf, -math.inf, -math.inf], [-math.inf] * 4])
    scores = torch.tensor([1.0, 2.0, 3.0])
    rewards, kl_mean = apply_kl_to_rewards(scores, log_prob, ref, mask, kl_coef=0.5, estimator="k1")
    expected = [[-0.1, -0.2, 1.0 - 0.3, 0.0], [2.0 - 0.05, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert rewards.tolist() == [pytest.approx(row) for row in expected]
    # mean over the two real sequences of each one's token mean: (.4 + .1) / 2 (token mean would be .325)
    assert isinstance(kl_mean, float)
    assert kl_mean == pytest.approx(0.25)


def test_apply_kl_to_rewards_k3_and_unknown_estimator():
    mask = torch.ones(1, 2)
    log_prob = torch.full((1, 2), math.log(0.5))
    ref = torch.full((1, 2), math.log(0.25))
    k3 = 0.5 - 1 + math.log(2)
    rewards, kl_mean = apply_kl_to_rewards(torch.tensor([1.0]), log_prob, ref, mask, kl_coef=0.1, estimator="k3")
    assert rewards[0].tolist() == pytest.approx([-0.1 * k3, 1.0 - 0.1 * k3])
    assert kl_mean == pytest.approx(k3)
    with pytest.raises(ValueError, match="allowed: k1, k2, k3"):
        apply_kl_to_rewards(torch.tensor([1.0]), log_prob, ref, mask, kl_coef=0.1, estimator="kl")
