"""Advantage estimators against hand computations (loops written here, closed-form numbers)."""

import math
import statistics

import pytest
import torch

from verl_bridge.algorithms import (
    ADVANTAGE_ESTIMATORS,
    compute_gae,
    compute_grpo,
    compute_reinforce_plus_plus,
    compute_rloo,
    needs_critic,
)


def _gae_by_hand(rewards, values, mask, gamma, lam):
    """Reference GAE on plain lists: run the recursion over the valid tokens of each row only."""
    adv_rows, ret_rows = [], []
    for r, v, m in zip(rewards, values, mask):
        idx = [t for t, on in enumerate(m) if on]
        adv = [0.0] * len(r)
        next_v, next_a = 0.0, 0.0
        for t in reversed(idx):
            delta = r[t] + gamma * next_v - v[t]
            next_a = delta + gamma * lam * next_a
            next_v = v[t]
            adv[t] = next_a
        adv_rows.append(adv)
        ret_rows.append([adv[t] + v[t] if m[t] else 0.0 for t in range(len(r))])
    return adv_rows, ret_rows


def test_gae_three_tokens_closed_form():
    # delta_2 = 1 - .3 = .7; A_2 = .7
    # delta_1 = .9*.3 - .4 = -.13; A_1 = -.13 + .72*.7 = .374
    # delta_0 = .9*.4 - .5 = -.14; A_0 = -.14 + .72*.374 = .12928
    adv, ret = compute_gae(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.4, 0.3]]), torch.ones(1, 3), gamma=0.9, lam=0.8
    )
    assert adv[0].tolist() == pytest.approx([0.12928, 0.374, 0.7])
    assert ret[0].tolist() == pytest.approx([0.62928, 0.774, 1.0])


def test_gae_matches_hand_loop_on_ragged_batch_with_padding_garbage():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.float32)
    rewards = torch.randn(4, 5) * mask
    values = torch.randn(4, 5)
    values[1, 3:] = 50.0  # critic output on padding must not matter
    adv, ret = compute_gae(rewards, values, mask, gamma=0.95, lam=0.9)
    exp_adv, exp_ret = _gae_by_hand(rewards.tolist(), values.tolist(), mask.tolist(), 0.95, 0.9)
    for got, exp in zip(adv.tolist(), exp_adv):
        assert got == pytest.approx(exp, abs=1e-6)
    for got, exp in zip(ret.tolist(), exp_ret):
        assert got == pytest.approx(exp, abs=1e-6)
    assert adv[3].tolist() == [0.0] * 5  # fully masked row


def test_gae_with_gamma_lam_one_is_monte_carlo_return_minus_value():
    rewards = torch.tensor([[0.0, 0.5, 2.0, 0.0]])
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    adv, ret = compute_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert adv[0].tolist() == pytest.approx([2.5 - 1.0, 2.5 - 2.0, 2.0 - 3.0, 0.0])
    assert ret[0].tolist() == pytest.approx([2.5, 2.5, 2.0, 0.0])


def test_gae_without_values_is_a_clear_error():
    with pytest.raises(ValueError, match="critic"):
        compute_gae(torch.zeros(2, 3), None, torch.ones(2, 3), gamma=1.0, lam=1.0)


def test_grpo_two_groups_closed_form():
    # group 0: scores 1, 2, 3 -> mean 2, sample std 1 -> advantages -1, 0, 1 (over 1 + eps)
    # group 1: 5, 5, 5 -> std 0 -> advantage 0, not NaN
    scores = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.float32)
    adv, ret = compute_grpo(scores, mask, group_size=3)
    eps = 1e-6
    per_row = [-1 / (1 + eps), 0.0, 1 / (1 + eps), 0.0, 0.0, 0.0]
    expected = [[a * m for m in row] for a, row in zip(per_row, mask.tolist())]
    assert [r for r in adv.tolist()] == [pytest.approx(e) for e in expected]
    assert torch.equal(adv, ret)
    assert not torch.isnan(adv).any()


def test_grpo_without_std_normalisation_and_with_other_std():
    # group 0: 0, 4 -> mean 2, sample std sqrt(8) ; group 1: 1, 1
    scores = torch.tensor([0.0, 4.0, 1.0, 1.0])
    mask = torch.ones(4, 2)
    adv, _ = compute_grpo(scores, mask, group_size=2, norm_by_std=True)
    assert adv[:, 0].tolist() == pytest.approx([-2 / (math.sqrt(8) + 1e-6), 2 / (math.sqrt(8) + 1e-6), 0, 0])
    adv, _ = compute_grpo(scores, mask, group_size=2, norm_by_std=False)
    assert adv[:, 0].tolist() == pytest.approx([-2.0, 2.0, 0.0, 0.0])


def test_grpo_falls_back_to_summed_token_rewards():
    token_rewards = torch.tensor([[0.0, 1.0, 9.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])  # the 9.0 is on padding
    adv, _ = compute_grpo(None, mask, group_size=2, norm_by_std=False, token_rewards=token_rewards)
    assert adv.tolist() == [[0.5, 0.5, 0.0], [-0.5, -0.5, -0.5]]


@pytest.mark.parametrize("fn", [compute_grpo, compute_rloo])
def test_group_size_not_dividing_batch_is_a_clear_error(fn):
    with pytest.raises(ValueError, match=r"batch of 5 rows is not divisible by group_size=2"):
        fn(torch.ones(5), torch.ones(5, 3), group_size=2)
    for bad in (0, None, 2.5):
        with pytest.raises(ValueError, match="positive integer"):
            fn(torch.ones(4), torch.ones(4, 3), group_size=bad)
    adv, _ = fn(torch.tensor([0.0, 1.0]), torch.ones(2, 1), group_size=torch.tensor(2))  # any integral type
    assert adv[0, 0] < 0 < adv[1, 0]


def test_rloo_leave_one_out_by_hand():
    # group 0: 1, 2, 6: baselines (2+6)/2=4, (1+6)/2=3.5, (1+2)/2=1.5
    # group 1: 0, 0, 3: baselines 1.5, 1.5, 0
    scores = torch.tensor([1.0, 2.0, 6.0, 0.0, 0.0, 3.0])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1], [0, 0], [1, 1]])
    adv, ret = compute_rloo(scores, mask, group_size=3)
    per_row = [1 - 4, 2 - 3.5, 6 - 1.5, 0 - 1.5, 0 - 1.5, 3 - 0]
    assert adv.tolist() == [pytest.approx([a * m for m in row]) for a, row in zip(per_row, mask.tolist())]
    assert torch.equal(adv, ret)


def test_rloo_identical_scores_give_zero():
    adv, _ = compute_rloo(torch.full((4,), 0.7), torch.ones(4, 2), group_size=4)
    assert adv.abs().max().item() == pytest.approx(0.0, abs=1e-6)


def test_reinforce_plus_plus_by_hand():
    gamma = 0.5
    rewards = [[0.1, 0.0, 1.0, 0.0], [0.0, -1.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2]]
    mask = [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    returns = []
    for r, m in zip(rewards, mask):
        g, row = 0.0, [0.0] * len(r)
        for t in reversed(range(len(r))):
            if m[t]:
                g = r[t] + gamma * g
                row[t] = g
        returns.append(row)
    valid = [returns[i][t] for i in range(3) for t in range(4) if mask[i][t]]
    mu, sd = statistics.mean(valid), math.sqrt(statistics.variance(valid) + 1e-8)
    expected_adv = [[(returns[i][t] - mu) / sd if mask[i][t] else 0.0 for t in range(4)] for i in range(3)]

    adv, ret = compute_reinforce_plus_plus(torch.tensor(rewards), torch.tensor(mask), gamma=gamma)
    assert ret.tolist() == [pytest.approx(row) for row in returns]
    assert adv.tolist() == [pytest.approx(row, abs=1e-6) for row in expected_adv]


def test_reinforce_plus_plus_uses_scores_when_no_token_rewards():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    _, ret = compute_reinforce_plus_plus(None, mask, gamma=1.0, scores=torch.tensor([2.0, -1.0]))
    assert ret.tolist() == [[2.0, 2.0, 0.0], [-1.0, -1.0, -1.0]]


@pytest.mark.parametrize("name", ["gae", "grpo", "rloo", "reinforce_plus_plus"])
def test_trainer_calling_convention(name):
    """The trainer passes the same keywords to every estimator; each ignores what it doesn't need."""
    torch.manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.float32)
    scores = torch.tensor([1.0, 0.0, 0.5, 0.25])
    token_rewards = torch.zeros(4, 4)
    token_rewards[torch.arange(4), torch.tensor([2, 1, 3, 0])] = scores
    adv, ret = ADVANTAGE_ESTIMATORS[name](
        token_rewards=token_rewards, values=torch.randn(4, 4), scores=scores, mask=mask,
        gamma=1.0, lam=0.95, group_size=2, norm_by_std=True,
    )
    assert adv.shape == ret.shape == (4, 4)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert (adv[mask == 0] == 0).all()
    assert not adv.requires_grad


def test_only_gae_needs_a_critic():
    assert needs_critic("gae")
    assert not any(needs_critic(n) for n in ("grpo", "rloo", "reinforce_plus_plus", "ppo"))


def test_unknown_estimator_lists_allowed_names():
    with pytest.raises(ValueError, match="unknown advantage estimator 'vtrace'; allowed: gae, grpo, reinforce_plus_plus, rloo"):
        ADVANTAGE_ESTIMATORS["vtrace"]
