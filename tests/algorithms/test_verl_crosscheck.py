"""verl_bridge.algorithms against verl 0.9.1's ``verl.trainer.ppo.core_algos`` on random inputs.

Runs in the verl tier (``bash .ci/verl_tier.sh``: its own venv with verl installed); the main tier
has no verl and skips this module. Inputs are float64 with ragged response masks (right padding
plus interior holes, which both libraries skip in their recursions) and garbage on padding.
Compared on valid tokens: verl leaves values on padding that no consumer reads (GAE returns
``advantages + values`` everywhere), verl_bridge zeroes them.

Known, documented differences that the inputs avoid or the comparisons account for:
- verl's GAE whitens its advantages; verl_bridge whitens when ``algorithm.whiten_advantages`` is
  set (``masked_whiten`` after ``compute_gae``), which is what is compared;
- verl always applies the dual clip (``clip_ratio_c`` default 3); verl_bridge only with
  ``dual_clip_c`` set: "no dual clip" is compared with ``clip_ratio_c=1e9``;
- verl's masked means divide by ``count + 1e-8``: tolerances are relative 1e-6.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

core_algos = pytest.importorskip(
    "verl.trainer.ppo.core_algos",
    reason="verl is not installed: the cross-check runs in the verl tier (bash .ci/verl_tier.sh)",
)
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

from verl_bridge import algorithms as A  # noqa: E402

pytestmark = pytest.mark.verl
TOL = dict(rtol=1e-6, atol=1e-8)


def _mask(g, rows, length, holes=True):
    lengths = torch.randint(1, length + 1, (rows,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).double()
    if holes:  # interior padding (tool / observation tokens in verl's multi-turn terms)
        hole = (torch.rand(rows, length, generator=g) < 0.15) & (torch.arange(length)[None] > 0)
        mask = torch.where(hole & (torch.arange(length)[None] < lengths[:, None] - 1), 0.0, mask)
    return mask


def _rand(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _close(ours, theirs, mask=None):
    if mask is not None:
        ours, theirs = ours[mask.bool()], theirs[mask.bool()]
    torch.testing.assert_close(ours, theirs.to(ours.dtype), **TOL)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.5)])
def test_gae_matches_verl(seed, gamma, lam):
    g = torch.Generator().manual_seed(seed)
    mask = _mask(g, 8, 12)
    rewards = _rand(g, 8, 12) * mask
    values = _rand(g, 8, 12)  # garbage on padding too
    adv, ret = A.compute_gae(rewards, values, mask, gamma=gamma, lam=lam)
    adv = A.masked_whiten(adv, mask)  # algorithm.whiten_advantages: true
    v_adv, v_ret = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    _close(adv, v_adv, mask)
    _close(ret, v_ret, mask)


def _index(rows, group_size):
    return np.repeat(np.arange(rows // group_size), group_size)


@pytest.mark.parametrize("group_size", [1, 2, 4, 8])
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_matches_verl(group_size, norm_by_std):
    g = torch.Generator().manual_seed(group_size)
    mask = _mask(g, 16, 6, holes=False)
    token_rewards = A.scores_to_token_rewards(torch.randint(0, 3, (16,), generator=g).double(), mask)
    token_rewards[3] = A.scores_to_token_rewards(torch.tensor([0.5] * 16, dtype=torch.float64), mask)[3]
    adv, ret = A.compute_grpo(None, mask, group_size=group_size, norm_by_std=norm_by_std, token_rewards=token_rewards)
    v_adv, v_ret = core_algos.compute_grpo_outcome_advantage(
        token_rewards, mask, _index(16, group_size), norm_adv_by_std_in_grpo=norm_by_std)
    _close(adv, v_adv)
    _close(ret, v_ret)


@pytest.mark.parametrize("group_size", [1, 2, 5])
def test_rloo_matches_verl(group_size):
    g = torch.Generator().manual_seed(10 + group_size)
    mask = _mask(g, 20, 5, holes=False)
    token_rewards = A.scores_to_token_rewards(_rand(g, 20), mask)
    adv, ret = A.compute_rloo(None, mask, group_size=group_size, token_rewards=token_rewards)
    v_adv, v_ret = core_algos.compute_rloo_outcome_advantage(token_rewards, mask, _index(20, group_size))
    _close(adv, v_adv)
    _close(ret, v_ret)


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_outcome_advantage_with_kl_in_reward_matches_verl(name):
    """KL in the reward: verl's compute_rewards (k1) then its outcome estimator on the penalised
    token-level rewards, against verl_bridge's apply_kl_to_rewards + the trainer's call."""
    g = torch.Generator().manual_seed(7)
    mask = _mask(g, 12, 9, holes=False)
    scores = torch.randint(0, 2, (12,), generator=g).double()
    log_prob, ref_log_prob = -torch.rand(12, 9, generator=g, dtype=torch.float64), -torch.rand(12, 9, generator=g, dtype=torch.float64)
    token_rewards, _ = A.apply_kl_to_rewards(scores, log_prob, ref_log_prob, mask, kl_coef=0.2, estimator="k1")
    v_rewards = core_algos.compute_rewards(A.scores_to_token_rewards(scores, mask), log_prob, ref_log_prob, 0.2) * mask
    _close(token_rewards, v_rewards)
    adv, _ = A.ADVANTAGE_ESTIMATORS[name](token_rewards=token_rewards, values=None, scores=scores, mask=mask,
                                          gamma=1.0, lam=1.0, group_size=4, norm_by_std=True)
    verl_fn = core_algos.get_adv_estimator_fn(name)
    v_adv, _ = verl_fn(token_level_rewards=v_rewards, response_mask=mask, index=_index(12, 4))
    _close(adv, v_adv)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus_matches_verl(seed, gamma):
    g = torch.Generator().manual_seed(20 + seed)
    mask = _mask(g, 8, 10)
    rewards = _rand(g, 8, 10)  # rewards on padding must be ignored by both
    adv, ret = A.compute_reinforce_plus_plus(rewards, mask, gamma=gamma)
    v_adv, v_ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=AlgoConfig(gamma=gamma))
    _close(adv, v_adv)
    _close(ret, v_ret)


def _actor_config(low, high, c):
    return ActorConfig(strategy="fsdp", rollout_n=1, clip_ratio=0.2, clip_ratio_low=low, clip_ratio_high=high,
                       clip_ratio_c=c, ppo_micro_batch_size_per_gpu=1, ppo_mini_batch_size=2, use_dynamic_bsz=False)


@pytest.mark.parametrize("mode", A.LOSS_AGG_MODES)
@pytest.mark.parametrize("dual_clip_c", [None, 3.0])
@pytest.mark.parametrize("low, high", [(0.2, 0.2), (0.1, 0.28)])
def test_ppo_policy_loss_matches_verl(mode, dual_clip_c, low, high):
    g = torch.Generator().manual_seed(int(low * 100) + (3 if dual_clip_c else 0))
    mask = _mask(g, 6, 8)
    old = -torch.rand(6, 8, generator=g, dtype=torch.float64) * 3
    new = old + 0.6 * _rand(g, 6, 8)
    new[:, 0] = old[:, 0] + 1.5  # ratio e^1.5 > 3 on every row's first (always valid) token...
    new = new.requires_grad_(True)
    adv = _rand(g, 6, 8)
    adv[:3, 0] = -1.0  # ...with a negative advantage on three rows: the dual clip bites there
    loss, st = A.ppo_policy_loss(new, old, adv, mask, clip_ratio_low=low, clip_ratio_high=high,
                                 dual_clip_c=dual_clip_c, loss_agg_mode=mode)
    (grad,) = torch.autograd.grad(loss, new)
    v_new = new.detach().clone().requires_grad_(True)
    v_loss, v_st = core_algos.compute_policy_loss_vanilla(
        old, v_new, adv, mask, loss_agg_mode=mode, config=_actor_config(low, high, dual_clip_c or 1e9))
    (v_grad,) = torch.autograd.grad(v_loss, v_new)
    _close(loss, v_loss)
    _close(grad, v_grad)
    for key in ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"):
        assert st[key] == pytest.approx(v_st[f"actor/{key}"], rel=1e-6, abs=1e-9), key
    if dual_clip_c:
        assert st["pg_clipfrac_lower"] > 0  # the inputs do exercise the dual clip


@pytest.mark.parametrize("mode", A.LOSS_AGG_MODES)
@pytest.mark.parametrize("clip", [0.2, 0.5])
def test_value_loss_matches_verl(mode, clip):
    g = torch.Generator().manual_seed(int(clip * 10))
    mask = _mask(g, 6, 8)
    old_values, returns = _rand(g, 6, 8), _rand(g, 6, 8)
    values = (old_values + 0.5 * _rand(g, 6, 8)).requires_grad_(True)
    loss, st = A.value_loss(values, old_values, returns, mask, clip_range=clip, loss_agg_mode=mode)
    v_loss, v_clipfrac = core_algos.compute_value_loss(values, returns, old_values, mask, clip, loss_agg_mode=mode)
    _close(loss, v_loss)
    assert st["vf_clipfrac"] == pytest.approx(float(v_clipfrac), rel=1e-6)
    assert 0 < st["vf_clipfrac"] < 1


@pytest.mark.parametrize("ours, theirs", [("k1", "k1"), ("k1", "kl"), ("k2", "k2"), ("k2", "mse"),
                                          ("k3", "k3"), ("k3", "low_var_kl")])
def test_kl_estimators_match_verl(ours, theirs):
    g = torch.Generator().manual_seed(3)
    log_prob = -torch.rand(5, 7, generator=g, dtype=torch.float64) * 4
    ref = log_prob + 3 * _rand(g, 5, 7)
    ref[0, 0] = log_prob[0, 0] + 30  # beyond the +-20 clamp (k3 is then clamped to 10)
    _close(A.kl_penalty(log_prob, ref, ours), core_algos.kl_penalty(log_prob, ref, theirs))


@pytest.mark.parametrize("mode", A.LOSS_AGG_MODES)
def test_loss_aggregation_matches_verl_locally_and_across_dp_ranks(mode):
    g = torch.Generator().manual_seed(5)
    loss_mat = _rand(g, 12, 9)
    mask = _mask(g, 12, 9)
    _close(A.aggregate_loss(loss_mat, mask, mode), core_algos.agg_loss(loss_mat, mask, mode))
    # 3 DP ranks x 2 micro-batches: verl's agg_loss with the global counts returns share * dp_size
    gb = A.GlobalBatch.of(mask)
    total = 0.0
    for rank in range(3):
        for mb in range(2):
            rows = slice(rank * 4 + mb * 2, rank * 4 + mb * 2 + 2)
            ours = A.aggregate_loss(loss_mat[rows], mask[rows], mode, global_batch=gb)
            theirs = core_algos.agg_loss(loss_mat[rows], mask[rows], mode, dp_size=3,
                                         batch_num_tokens=gb.tokens, global_batch_size=gb.sequences)
            _close(ours * 3, theirs)
            total = total + ours
    _close(total, A.aggregate_loss(loss_mat, mask, mode))
