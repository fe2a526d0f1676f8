"""Outcome estimators (GRPO, RLOO) with ``algorithm.kl.placement: reward`` see the KL-penalised rewards.

Regression test for issue #17: the trainer folds the KL penalty into ``token_rewards`` but also passes
the raw ``scores``; the outcome estimators used to read ``scores`` and so silently dropped the KL.
verl's semantics (``apply_kl_penalty`` then ``compute_grpo_outcome_advantage``): the sequence score
an outcome estimator normalises is the row sum of the token-level rewards, KL penalty included.
"""

import pytest
import torch

from verl_bridge.algorithms import ADVANTAGE_ESTIMATORS, apply_kl_to_rewards, masked_sum


def _batch():
    g = torch.Generator().manual_seed(17)
    mask = torch.ones(6, 5)
    mask[1, 3:] = 0
    mask[4, 1:] = 0
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    log_prob = -torch.rand(6, 5, generator=g) * 2
    ref_log_prob = log_prob + 0.5 * torch.randn(6, 5, generator=g)
    return scores, log_prob, ref_log_prob, mask


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_outcome_estimators_use_kl_penalised_rewards_as_the_trainer_calls_them(name):
    scores, log_prob, ref_log_prob, mask = _batch()
    token_rewards, kl_mean = apply_kl_to_rewards(scores, log_prob, ref_log_prob, mask, kl_coef=0.3, estimator="k1")
    assert kl_mean != 0.0
    # the trainer passes both: the penalised token rewards and the raw scores
    adv, _ = ADVANTAGE_ESTIMATORS[name](token_rewards=token_rewards, values=None, scores=scores, mask=mask,
                                        gamma=1.0, lam=1.0, group_size=3, norm_by_std=True)
    penalised = masked_sum(token_rewards, mask, dim=-1)  # score - 0.3 * sum_t kl_t
    expected, _ = ADVANTAGE_ESTIMATORS[name](scores=penalised, mask=mask, group_size=3, norm_by_std=True)
    raw, _ = ADVANTAGE_ESTIMATORS[name](scores=scores, mask=mask, group_size=3, norm_by_std=True)
    assert not torch.allclose(expected, raw, atol=1e-3)  # the KL changes the answer...
    torch.testing.assert_close(adv, expected)  # ...and the estimator must see it


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_without_kl_token_rewards_and_scores_agree(name):
    scores, log_prob, ref_log_prob, mask = _batch()
    token_rewards, _ = apply_kl_to_rewards(scores, log_prob, ref_log_prob, mask, kl_coef=0.0, estimator="k1")
    adv, _ = ADVANTAGE_ESTIMATORS[name](token_rewards=token_rewards, scores=scores, mask=mask, group_size=3)
    expected, _ = ADVANTAGE_ESTIMATORS[name](scores=scores, mask=mask, group_size=3)
    torch.testing.assert_close(adv, expected)
