"""Rollout-training mismatch metrics and truncated importance sampling (TIS), on constructed log-probs."""

import math

import pytest
import torch

from verl_bridge.algorithms import ppo_policy_loss
from verl_bridge.algorithms.rollout_correction import rollout_mismatch, tis_weights

# per token: log p_train_old - log p_rollout = 0, +0.5, -1, +2 (capped at 2), and a padded token
OLD = torch.tensor([[-1.0, -0.5, -2.0, -0.2, -3.0]])
ROLLOUT = torch.tensor([[-1.0, -1.0, -1.0, -2.2, -9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])


def test_tis_weight_is_the_capped_ratio_per_token():
    w = tis_weights(OLD, ROLLOUT, cap=2.0)
    expected = [1.0, math.exp(0.5), math.exp(-1.0), 2.0, 2.0]  # exp(2) = 7.39 and exp(6) capped
    assert w.shape == OLD.shape
    assert torch.allclose(w[0], torch.tensor(expected), atol=1e-6)
    assert torch.allclose(tis_weights(OLD, ROLLOUT, cap=10.0)[0, 3], torch.tensor(math.exp(2.0)))
    old = OLD.clone().requires_grad_(True)
    assert not tis_weights(old, ROLLOUT, 2.0).requires_grad  # a weight, never a gradient path
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="cap must be > 0"):
            tis_weights(OLD, ROLLOUT, bad)


def test_policy_loss_weights_each_token_before_aggregation():
    adv = torch.tensor([[1.0, -1.0, 2.0, 0.5, 100.0]])
    new = (OLD + torch.tensor([[0.1, -0.1, 0.05, 0.3, 0.0]])).requires_grad_(True)
    w = tis_weights(OLD, ROLLOUT, cap=2.0)
    loss, _ = ppo_policy_loss(new, OLD, adv, MASK, token_weights=w)
    # by hand: clipped PPO per token, times w, token-mean over the 4 real tokens
    ratio = torch.exp(new.detach() - OLD)
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    assert torch.allclose(loss.detach(), (per_token * w * MASK).sum() / MASK.sum(), atol=1e-6)
    plain, _ = ppo_policy_loss(new, OLD, adv, MASK)
    assert not torch.allclose(loss, plain)
    loss.backward()  # gradients scale by the weights too
    g_weighted = new.grad.clone()
    new.grad = None
    plain.backward()
    real = MASK.bool()
    nz = real & (new.grad.abs() > 0)
    assert torch.allclose(g_weighted[nz], new.grad[nz] * w[nz], atol=1e-6)
    # weights of one: exactly the plain loss
    one, _ = ppo_policy_loss(new, OLD, adv, MASK, token_weights=torch.ones_like(OLD))
    assert torch.allclose(one, plain)


def test_mismatch_metrics():
    m = rollout_mismatch(ROLLOUT, OLD, MASK)
    assert set(m) == {"mismatch/logprob_abs_mean", "mismatch/kl_k3"}
    assert m["mismatch/logprob_abs_mean"] == pytest.approx((0 + 0.5 + 1.0 + 2.0) / 4, abs=1e-6)
    # k3 of KL(rollout || train) with log r = train - rollout: r - 1 - log r
    k3 = [math.exp(d) - 1 - d for d in (0.0, 0.5, -1.0, 2.0)]
    assert m["mismatch/kl_k3"] == pytest.approx(sum(k3) / 4, abs=1e-6)
    same = rollout_mismatch(OLD, OLD, MASK)
    assert same == {"mismatch/logprob_abs_mean": 0.0, "mismatch/kl_k3": 0.0}


def _problems(**correction) -> str:
    from verl_bridge.config import ConfigError, load_config

    try:
        load_config({"algorithm": {"rollout_correction": correction}, "model": {"actor": {"args": {"preset": "tiny"}}},
                     "data": {"task": "repeat"}})
    except ConfigError as e:
        return str(e)
    return ""


def test_rollout_correction_is_validated():
    assert _problems(type="tis", cap=2.0) == ""
    assert "algorithm.rollout_correction.type='is': unknown name; allowed: tis" in _problems(type="is", cap=2.0)
    for cap in (0.0, -1.0):
        assert f"algorithm.rollout_correction.cap={cap}: out of range" in _problems(type="tis", cap=cap)
    assert "rollout_correction.clip" in _problems(type="tis", clip=2.0)  # unknown keys are named


def test_rollout_correction_is_off_by_default():
    from verl_bridge.config import load_config

    cfg = load_config({"model": {"actor": {"args": {"preset": "tiny"}}}, "data": {"task": "repeat"}})
    assert cfg.algorithm.rollout_correction is None
    on = load_config({"model": {"actor": {"args": {"preset": "tiny"}}}, "data": {"task": "repeat"},
                      "algorithm": {"rollout_correction": {"type": "tis"}}})
    assert (on.algorithm.rollout_correction.type, on.algorithm.rollout_correction.cap) == ("tis", 2.0)
