"""Masked reductions and loss aggregation shared by the estimators and losses.

All masks are ``[B, T]`` over RESPONSE tokens (1 = a real token, 0 = padding), float or bool.
Reductions select with the mask rather than multiply by it, so garbage in padded positions
(``-inf`` log-probs, NaN values) never leaks into a result. An empty selection reduces to 0,
never to NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verl_bridge.algorithms.registry import UnknownNameError

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


def _weights(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if mask.shape != x.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match tensor shape {tuple(x.shape)}")
    return mask.to(x.dtype if x.is_floating_point() else torch.float32)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """``sum(x * mask)`` over ``dim`` (all dims when None), ignoring whatever ``x`` holds where mask is 0."""
    w = _weights(x, mask)
    picked = torch.where(w != 0, x * w, torch.zeros((), dtype=w.dtype, device=x.device))
    return picked.sum() if dim is None else picked.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """``sum(x * mask) / sum(mask)`` over ``dim``; 0 where the mask selects nothing."""
    w = _weights(x, mask)
    total = masked_sum(x, w, dim)
    count = w.sum() if dim is None else w.sum(dim=dim)
    return torch.where(count > 0, total / torch.where(count > 0, count, torch.ones_like(count)), torch.zeros_like(total))


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the selected elements (scalar), with Bessel's correction when ``unbiased``.

    As verl's ``masked_var``, except that fewer than two selected elements give variance 0
    instead of an error.
    """
    w = _weights(x, mask)
    mean = masked_mean(x, w)
    var = masked_mean((x - mean) ** 2, w)
    count = w.sum()
    if unbiased and count > 1:
        var = var * count / (count - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise the selected elements to unit variance (and zero mean when ``shift_mean``).

    ``(x - mean) / sqrt(var + eps)``, mean and (unbiased) variance over the masked elements of the
    whole tensor; with ``shift_mean=False`` the mean is added back. Same formula as verl's
    ``verl.utils.torch_functional.masked_whiten`` (itself from TRL). Padded positions are returned
    as 0.
    """
    w = _weights(x, mask)
    mean = masked_mean(x, w)
    var = masked_var(x, w)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(w != 0, whitened, torch.zeros_like(whitened))


@dataclass(frozen=True)
class GlobalBatch:
    """Normalisers of one optimizer step: counts over its WHOLE mini-batch, all micro-batches on all DP ranks.

    ``tokens``: valid response tokens; ``sequences``: rows with at least one valid token. Build one
    per rank with :meth:`of` and sum it over the micro-batches and the DP group (the trainer
    all-reduces ``[tokens, sequences]``). verl passes the same two numbers to its ``agg_loss`` as
    ``batch_num_tokens`` and ``global_batch_size``; Megatron-LM normalises by the global token count
    the same way (``calculate_per_token_loss``).
    """

    tokens: float
    sequences: float

    def __post_init__(self):
        if self.tokens < 0 or self.sequences < 0:
            raise ValueError(f"GlobalBatch tokens and sequences must be >= 0, got {self.tokens}, {self.sequences}")

    @classmethod
    def of(cls, mask: torch.Tensor) -> "GlobalBatch":
        """The counts of one ``[B, T]`` response mask."""
        if mask.dim() != 2:
            raise ValueError(f"mask must be [B, T] over response tokens, got shape {tuple(mask.shape)}")
        on = mask != 0
        return cls(float(on.sum()), float(on.any(dim=-1).sum()))

    def __add__(self, other: "GlobalBatch") -> "GlobalBatch":
        return GlobalBatch(self.tokens + other.tokens, self.sequences + other.sequences)


def _divide(total: torch.Tensor, count) -> torch.Tensor:
    """``total / count``, 0 when ``count`` is 0 (an empty selection, never NaN)."""
    count = torch.as_tensor(count, dtype=total.dtype, device=total.device)
    return torch.where(count > 0, total / torch.where(count > 0, count, torch.ones_like(count)), torch.zeros_like(total))


def aggregate_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str,
                   global_batch: GlobalBatch | None = None) -> torch.Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar (verl ``core_algos.agg_loss``).

    - ``token-mean``: ``sum_{i,t} m_it l_it / sum_{i,t} m_it`` -- every token weighs the same
      (DAPO, arXiv:2503.14476).
    - ``seq-mean-token-sum``: ``mean_i sum_t m_it l_it`` -- longer answers weigh more
      (Dr. GRPO, arXiv:2503.20783).
    - ``seq-mean-token-mean``: ``mean_i (sum_t m_it l_it / sum_t m_it)`` -- every sequence weighs
      the same (original GRPO, arXiv:2402.03300).

    Rows whose mask is all zero are not sequences: in the two ``seq-mean`` modes they neither
    contribute nor count (verl would count them, or divide by zero). A fully masked batch gives 0.

    ``global_batch``: ``loss_mat`` is one micro-batch of a larger mini-batch (more micro-batches,
    more DP ranks). The outer mean then divides by the mini-batch's counts
    (``global_batch.tokens`` or ``.sequences``) instead of this micro-batch's, so the result is this
    micro-batch's SHARE: the shares of all micro-batches on all ranks add up to the aggregate of the
    whole mini-batch. (A mean of per-micro-batch means would weigh a token of a short micro-batch
    more than one of a long one.) verl's ``agg_loss(..., dp_size, batch_num_tokens,
    global_batch_size)`` returns this share times ``dp_size``.
    """
    if loss_mat.dim() != 2:
        raise ValueError(f"loss_mat must be [B, T], got shape {tuple(loss_mat.shape)}")
    if mode not in LOSS_AGG_MODES:
        raise UnknownNameError(f"unknown loss_agg_mode {mode!r}; allowed: {', '.join(LOSS_AGG_MODES)}")
    w = _weights(loss_mat, mask)
    if mode == "token-mean":
        if global_batch is None:
            return masked_mean(loss_mat, w)
        return _divide(masked_sum(loss_mat, w), global_batch.tokens)
    per_seq = masked_sum(loss_mat, w, dim=-1) if mode == "seq-mean-token-sum" else masked_mean(loss_mat, w, dim=-1)
    has_tokens = (w != 0).any(dim=-1)
    if global_batch is None:
        return masked_mean(per_seq, has_tokens)
    return _divide(masked_sum(per_seq, has_tokens), global_batch.sequences)


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last non-zero position of each row of ``mask`` ``[B, T]`` (-1 for an empty row)."""
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    return torch.where(mask != 0, positions, torch.full_like(positions, -1)).amax(dim=-1)


def scores_to_token_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence score ``[B]`` on the last valid token of its row; ``[B, T]``.

    A row with no valid token gets no reward (its score has no token to land on).
    """
    if scores.dim() != 1 or scores.shape[0] != mask.shape[0]:
        raise ValueError(f"scores must be [B]={mask.shape[0]}, got shape {tuple(scores.shape)}")
    dtype = scores.dtype if scores.is_floating_point() else torch.float32
    rewards = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    last = last_token_index(mask)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    rewards[rows, last[rows]] = scores[rows].to(dtype)
    return rewards
