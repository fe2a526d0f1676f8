"""Masked reductions, whitening and the three loss aggregation modes, on ragged masks."""

import math

import pytest
import torch

from verl_bridge.algorithms import (
    LOSS_AGG_MODES,
    aggregate_loss,
    last_token_index,
    masked_mean,
    masked_sum,
    masked_whiten,
    scores_to_token_rewards,
)

# Row 0 has 3 tokens, row 1 has 1, row 2 is fully masked (e.g. a padding row).
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]])


def test_masked_sum_and_mean_ignore_garbage_in_padding():
    x = LOSS.clone()
    x[0, 3] = float("-inf")
    x[1, 2] = float("nan")
    assert masked_sum(x, MASK).item() == 1 + 2 + 3 + 5
    assert masked_mean(x, MASK).item() == pytest.approx((1 + 2 + 3 + 5) / 4)
    # per row: a fully masked row reduces to 0, not NaN
    assert masked_mean(x, MASK, dim=-1).tolist() == [2.0, 5.0, 0.0]
    assert masked_sum(x, MASK.bool(), dim=-1).tolist() == [6.0, 5.0, 0.0]


def test_masked_mean_of_empty_selection_is_zero():
    assert masked_mean(LOSS, torch.zeros_like(LOSS)).item() == 0.0


def test_masked_whiten_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # mean 2, unbiased variance ((1)^2 + 0 + 1^2) / (3 - 1) = 1
    expected = [(v - 2.0) / math.sqrt(1.0 + 1e-8) for v in (1.0, 2.0, 3.0)] + [0.0]
    assert masked_whiten(x, mask)[0].tolist() == pytest.approx(expected)
    unshifted = masked_whiten(x, mask, shift_mean=False)[0].tolist()
    assert unshifted == pytest.approx([e + 2.0 for e in expected[:3]] + [0.0])


def test_masked_whiten_single_token_and_empty_give_zero_not_nan():
    x = torch.tensor([[4.0, 7.0]])
    assert masked_whiten(x, torch.tensor([[1, 0]])).tolist() == [[0.0, 0.0]]
    assert masked_whiten(x, torch.tensor([[0, 0]])).tolist() == [[0.0, 0.0]]


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", (1 + 2 + 3 + 5) / 4),  # 4 valid tokens weigh the same
        ("seq-mean-token-sum", ((1 + 2 + 3) + 5) / 2),  # 2 real sequences, token sums
        ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + 5) / 2),  # 2 real sequences, token means
    ],
)
def test_aggregate_loss_modes_on_ragged_mask(mode, expected):
    assert mode in LOSS_AGG_MODES
    assert aggregate_loss(LOSS, MASK, mode).item() == pytest.approx(expected)
    assert aggregate_loss(LOSS, MASK.bool(), mode).item() == pytest.approx(expected)


def test_aggregate_loss_gradients_follow_the_weighting():
    loss_mat = LOSS.clone().requires_grad_(True)
    aggregate_loss(loss_mat, MASK, "seq-mean-token-mean").backward()
    # row 0: 1/2 (seq mean) * 1/3 (token mean); row 1: 1/2 * 1; padding and empty row: 0
    expected = [[1 / 6, 1 / 6, 1 / 6, 0.0], [0.5, 0.0, 0.0, 0.0], [0.0] * 4]
    assert loss_mat.grad.tolist() == [pytest.approx(row) for row in expected]


def test_aggregate_loss_fully_masked_batch_is_zero():
    for mode in LOSS_AGG_MODES:
        assert aggregate_loss(LOSS, torch.zeros_like(MASK), mode).item() == 0.0


def test_aggregate_loss_unknown_mode_lists_allowed():
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-sum, seq-mean-token-mean"):
        aggregate_loss(LOSS, MASK, "sum")


def test_scores_land_on_last_valid_token():
    assert last_token_index(MASK).tolist() == [2, 0, -1]
    rewards = scores_to_token_rewards(torch.tensor([1.5, -2.0, 7.0]), MASK)
    assert rewards.tolist() == [[0, 0, 1.5, 0], [-2.0, 0, 0, 0], [0, 0, 0, 0]]
