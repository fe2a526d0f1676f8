"""PPO / value losses on constructed ratios, entropy, and the k1/k2/k3 KL estimators."""

import math

import pytest
import torch

from verl_bridge.algorithms import (
    KL_ESTIMATORS,
    POLICY_LOSSES,
    entropy_from_logits,
    kl_penalty,
    ppo_policy_loss,
    value_loss,
)

# One row of six real tokens with chosen ratios r = pi/pi_old and advantages, plus one padded
# token carrying a huge ratio that must not count. Per token, with eps = 0.2:
#   r=0.5 A=+1: max(-0.5, -0.8)  = -0.5  unclipped
#   r=1.5 A=+1: max(-1.5, -1.2)  = -1.2  clipped
#   r=0.5 A=-1: max( 0.5,  0.8)  =  0.8  clipped
#   r=1.5 A=-1: max( 1.5,  1.2)  =  1.5  unclipped
#   r=1.0 A=+2: max(-2.0, -2.0)  = -2.0  (tie: not clipped)
#   r=5.0 A=-1: max( 5.0,  1.2)  =  5.0  unclipped; dual clip c=3 caps it at 3
RATIOS = [0.5, 1.5, 0.5, 1.5, 1.0, 5.0, 100.0]
ADVS = [1.0, 1.0, -1.0, -1.0, 2.0, -1.0, -1.0]
MASK = torch.tensor([[1, 1, 1, 1, 1, 1, 0]], dtype=torch.float32)


def _inputs():
    old = torch.full((1, 7), -1.0)
    new = (old + torch.log(torch.tensor([RATIOS]))).requires_grad_(True)
    return new, old, torch.tensor([ADVS])


def test_ppo_clipped_loss_and_clipfrac():
    new, old, adv = _inputs()
    loss, stats = ppo_policy_loss(new, old, adv, MASK)
    assert loss.item() == pytest.approx((-0.5 - 1.2 + 0.8 + 1.5 - 2.0 + 5.0) / 6)
    assert stats["pg_clipfrac"] == pytest.approx(2 / 6)
    assert stats["pg_clipfrac_lower"] == 0.0
    expected_kl = -sum(math.log(r) for r in RATIOS[:6]) / 6
    assert stats["ppo_kl"] == pytest.approx(expected_kl, rel=1e-5)
    assert all(isinstance(v, float) for v in stats.values())

    loss.backward()
    # d(-A r)/d log_prob = -A r on unclipped tokens; clipped tokens and padding get no gradient
    expected_grad = [-0.5 / 6, 0.0, 0.0, 1.5 / 6, -2.0 / 6, 5.0 / 6, 0.0]
    assert new.grad[0].tolist() == pytest.approx(expected_grad, abs=1e-6)


def test_ppo_dual_clip_caps_negative_advantage_loss():
    new, old, adv = _inputs()
    loss, stats = ppo_policy_loss(new, old, adv, MASK, dual_clip_c=3.0)
    assert loss.item() == pytest.approx((-0.5 - 1.2 + 0.8 + 1.5 - 2.0 + 3.0) / 6)
    assert stats["pg_clipfrac_lower"] == pytest.approx(1 / 6)
    assert stats["pg_clipfrac"] == pytest.approx(2 / 6)
    loss.backward()
    assert new.grad[0, 5].item() == 0.0  # capped token: constant -A*c


def test_ppo_asymmetric_clip_higher():
    new, old, adv = _inputs()
    loss, _ = ppo_policy_loss(new, old, adv, MASK, clip_ratio_low=0.2, clip_ratio_high=0.28)
    # only r=1.5, A=+1 changes: -clip(1.5, .8, 1.28) = -1.28
    assert loss.item() == pytest.approx((-0.5 - 1.28 + 0.8 + 1.5 - 2.0 + 5.0) / 6)


def test_ppo_loss_agg_mode_is_applied():
    new, old, adv = _inputs()
    loss, _ = ppo_policy_loss(new, old, adv, MASK, loss_agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(-0.5 - 1.2 + 0.8 + 1.5 - 2.0 + 5.0)


def test_ppo_on_policy_has_no_clipping_and_zero_kl():
    logp = torch.randn(3, 5)
    adv = torch.randn(3, 5)
    loss, stats = ppo_policy_loss(logp, logp.clone(), adv, torch.ones(3, 5))
    assert loss.item() == pytest.approx(-adv.mean().item(), abs=1e-6)
    assert stats["pg_clipfrac"] == 0.0 and stats["ppo_kl"] == 0.0


def test_ppo_is_registered_and_rejects_bad_dual_clip():
    assert POLICY_LOSSES["ppo"] is ppo_policy_loss
    new, old, adv = _inputs()
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        ppo_policy_loss(new, old, adv, MASK, dual_clip_c=0.9)
    with pytest.raises(ValueError, match="allowed: ppo"):
        POLICY_LOSSES["reinforce"]


def test_value_loss_clipping_by_hand():
    # v=1.0 old=.5 R=0: clip -> .7; max(1.0, .49) = 1.0   unclipped
    # v=1.0 old=.5 R=2: clip -> .7; max(1.0, 1.69) = 1.69 clipped
    # v=.6  old=.5 R=0: inside the range;  .36          not clipped
    values = torch.tensor([[1.0, 1.0, 0.6, 42.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.5, 0.0]])
    returns = torch.tensor([[0.0, 2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = value_loss(values, old, returns, mask, clip_range=0.2)
    assert loss.item() == pytest.approx(0.5 * (1.0 + 1.69 + 0.36) / 3)
    assert stats["vf_clipfrac"] == pytest.approx(1 / 3)
    assert stats["vpred_mean"] == pytest.approx((1.0 + 1.0 + 0.6) / 3)
    loss.backward()
    # d/dv 0.5*(v-R)^2/3 = (v-R)/3 on unclipped tokens; clipped and padded tokens: 0
    assert values.grad[0].tolist() == pytest.approx([1.0 / 3, 0.0, 0.6 / 3, 0.0])

    loss, stats = value_loss(values, old, returns, mask, clip_range=None)
    assert loss.item() == pytest.approx(0.5 * (1.0 + 1.0 + 0.36) / 3)
    assert stats["vf_clipfrac"] == 0.0


def test_entropy_from_logits():
    uniform = entropy_from_logits(torch.zeros(2, 3, 4))
    assert uniform.shape == (2, 3)
    assert uniform.flatten().tolist() == pytest.approx([math.log(4)] * 6)
    p = torch.tensor([0.5, 0.25, 0.25])
    h = -(p * p.log()).sum().item()  # 1.0397...
    assert entropy_from_logits(p.log()).item() == pytest.approx(h)
    assert entropy_from_logits(torch.tensor([100.0, 0.0, 0.0])).item() == pytest.approx(0.0, abs=1e-6)
    out = entropy_from_logits(torch.randn(2, 5, dtype=torch.bfloat16))
    assert out.shape == (2,) and out.dtype == torch.float32


def test_kl_estimators_at_a_point():
    # pi(x) = 0.5, pi_ref(x) = 0.25 -> log r = log(pi_ref / pi) = -log 2
    logp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    ln2 = math.log(2)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(ln2)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * ln2**2)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + ln2)
    # the other direction: pi = 0.25, pi_ref = 0.5 -> r = 2
    assert kl_penalty(ref, logp, "k1").item() == pytest.approx(-ln2)
    assert kl_penalty(ref, logp, "k3").item() == pytest.approx(2 - 1 - ln2)


def test_kl_estimators_zero_on_policy_and_k3_clamped():
    x = torch.randn(2, 3)
    for name in ("k1", "k2", "k3"):
        assert kl_penalty(x, x, name).abs().max().item() == 0.0
    # log r = 30 is clamped to 20 before exp, then the estimate to 10
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([30.0]), "k3").item() == 10.0
    # log r = -30 -> -20: exp(-20) + 20 - 1 ~ 19, clamped to 10
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([-30.0]), "k3").item() == 10.0
    # inside the clamp: log r = 2 -> e^2 - 3
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([2.0]), "k3").item() == pytest.approx(math.exp(2) - 3)
    assert sorted(KL_ESTIMATORS) == ["k1", "k2", "k3"]


def test_unknown_kl_estimator_lists_allowed():
    with pytest.raises(ValueError, match="unknown KL estimator 'low_var'; allowed: k1, k2, k3"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "low_var")
