"""Loss aggregation over a whole mini-batch split into micro-batches and DP ranks (issue #17).

``token-mean`` must weigh every token of the optimizer step's mini-batch the same, whichever
micro-batch and DP rank it lands on (Megatron / verl normalise by the global token count). Each
micro-batch's ``aggregate_loss(..., global_batch=...)`` is its share; the shares of all
micro-batches on all ranks add up to the aggregate of the concatenated mini-batch.
"""

import pytest
import torch

from verl_bridge.algorithms import LOSS_AGG_MODES, GlobalBatch, aggregate_loss


def _ragged(seed=0, rows=12, length=7):
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(rows, length, generator=g)
    lengths = torch.tensor([7, 1, 3, 7, 2, 0, 5, 7, 1, 1, 6, 4])[:rows]
    mask = (torch.arange(length)[None] < lengths[:, None]).float()
    return loss, mask


def _split(loss, mask, ranks=2, micro=3):
    """rows -> [rank][micro-batch] of (loss, mask), unequal token counts per piece."""
    per_rank = loss.shape[0] // ranks
    out = []
    for r in range(ranks):
        lo, ma = loss[r * per_rank:(r + 1) * per_rank], mask[r * per_rank:(r + 1) * per_rank]
        size = per_rank // micro
        out.append([(lo[i:i + size], ma[i:i + size]) for i in range(0, per_rank, size)])
    return out


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_shares_add_up_to_the_global_aggregate(mode):
    loss, mask = _ragged()
    pieces = _split(loss, mask)
    gb = GlobalBatch.of(mask)
    assert gb.tokens == mask.sum().item() and gb.sequences == 11  # one row is empty
    total = sum(aggregate_loss(lo, ma, mode, global_batch=gb) for rank in pieces for lo, ma in rank)
    torch.testing.assert_close(total, aggregate_loss(loss, mask, mode))


def test_mean_of_micro_batch_means_is_not_the_token_mean():
    """What the trainer did before issue #17: every micro-batch's own token mean, averaged."""
    loss, mask = _ragged()
    pieces = _split(loss, mask)
    old = sum(aggregate_loss(lo, ma, "token-mean") for rank in pieces for lo, ma in rank) / 6
    assert abs(old.item() - aggregate_loss(loss, mask, "token-mean").item()) > 1e-2


def test_global_batch_sums_counts_and_rejects_bad_input():
    _, mask = _ragged()
    a, b = GlobalBatch.of(mask[:5]), GlobalBatch.of(mask[5:])
    assert (a + b) == GlobalBatch.of(mask)
    with pytest.raises(ValueError, match="mask must be"):
        GlobalBatch.of(mask[0])
    with pytest.raises(ValueError, match="tokens and sequences must be >= 0"):
        GlobalBatch(tokens=-1.0, sequences=2.0)


def test_an_empty_global_batch_gives_zero_not_nan():
    loss, mask = _ragged()
    gb = GlobalBatch.of(torch.zeros_like(mask))
    for mode in LOSS_AGG_MODES:
        assert aggregate_loss(loss, torch.zeros_like(mask), mode, global_batch=gb).item() == 0.0
