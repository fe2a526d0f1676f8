"""Advantage estimators: GAE (PPO), GRPO, RLOO, REINFORCE++.

Shapes: ``[B, T]`` over RESPONSE tokens only; ``mask`` is 1 on real response tokens. Every
estimator returns ``(advantages, returns)`` with advantages zero on padding, and is computed
without gradients.

The trainer calls each registered estimator with one set of keywords::

    ADVANTAGE_ESTIMATORS[name](token_rewards=..., values=..., scores=..., mask=..., gamma=...,
                               lam=..., group_size=..., norm_by_std=...)

so each accepts ``**kwargs`` and ignores what it does not use. Every estimator reads
``token_rewards`` ``[B, T]`` first: the token-level estimators (GAE, REINFORCE++) run their
recursions over it, and the outcome estimators (GRPO, RLOO) take each row's masked SUM as the
sequence's score. ``scores`` ``[B]`` is the fallback when ``token_rewards`` is None (token-level
estimators then put each score on its row's last valid token).

KL in the reward (``algorithm.kl.placement: reward``): the trainer passes
``token_rewards = score on the last token - coef * kl_t on every token``
(:func:`~verl_bridge.algorithms.kl_control.apply_kl_to_rewards`), so an outcome estimator
normalises ``score_i - coef * sum_t kl_it`` within the group, as verl does (its ``apply_kl_penalty``
writes ``token_level_rewards`` and ``compute_grpo_outcome_advantage`` / ``compute_rloo_outcome_advantage``
sum them). Reading the raw ``scores`` instead would silently drop the KL (issue #17).

Whether to whiten GAE advantages is the trainer's choice (``algorithm.whiten_advantages``,
:func:`~verl_bridge.algorithms.core.masked_whiten`); verl whitens inside its GAE, we do not.
"""

from __future__ import annotations

import operator

import torch

from verl_bridge.algorithms.core import masked_sum, masked_whiten, scores_to_token_rewards
from verl_bridge.algorithms.registry import register_advantage


def _float_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T] over response tokens, got shape {tuple(mask.shape)}")
    return mask.to(like.dtype if like.is_floating_point() else torch.float32)


def _token_rewards(token_rewards, scores, mask) -> torch.Tensor:
    if token_rewards is None:
        if scores is None:
            raise ValueError("this estimator needs token_rewards [B, T] (or scores [B]); both are None")
        token_rewards = scores_to_token_rewards(scores, mask)
    if token_rewards.shape != mask.shape:
        raise ValueError(
            f"token_rewards shape {tuple(token_rewards.shape)} does not match mask shape {tuple(mask.shape)}"
        )
    return token_rewards


def _grouped_scores(scores, token_rewards, mask, group_size) -> tuple[torch.Tensor, int]:
    """Sequence scores as ``[n_groups, group_size]`` (contiguous rows form one group), and ``group_size``
    as an int. The score of a row is the masked sum of its ``token_rewards`` (KL penalty included when
    the KL sits in the reward); ``scores`` only when ``token_rewards`` is None."""
    if token_rewards is not None:
        if token_rewards.shape != mask.shape:
            raise ValueError(
                f"token_rewards shape {tuple(token_rewards.shape)} does not match mask shape {tuple(mask.shape)}"
            )
        scores = masked_sum(token_rewards, mask, dim=-1)
    elif scores is None:
        raise ValueError("this estimator needs token_rewards [B, T] (or scores [B]); both are None")
    if scores.dim() != 1 or scores.shape[0] != mask.shape[0]:
        raise ValueError(
            f"scores must be [B] with B = mask rows = {mask.shape[0]}, got shape {tuple(scores.shape)}"
        )
    try:
        group_size = operator.index(group_size)
    except TypeError:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}") from None
    if group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    batch = scores.shape[0]
    if batch % group_size:
        raise ValueError(
            f"batch of {batch} rows is not divisible by group_size={group_size} "
            f"({batch} % {group_size} = {batch % group_size}); group estimators need "
            f"B = n_prompts * group_size with each prompt's responses in contiguous rows"
        )
    scores = scores if scores.is_floating_point() else scores.float()
    return scores.reshape(batch // group_size, group_size), group_size


@register_advantage("gae", needs_critic=True)
@torch.no_grad()
def compute_gae(token_rewards, values, mask, gamma: float, lam: float, scores=None, **_):
    """Generalized Advantage Estimation (Schulman et al. 2016, arXiv:1506.02438).

    ``delta_t = r_t + gamma * V_{t+1} - V_t``, ``A_t = delta_t + gamma * lam * A_{t+1}``,
    ``returns_t = A_t + V_t`` (both 0 on padding). Recursion runs over valid tokens only: padded positions are
    skipped (``V_{t+1}`` and ``A_{t+1}`` are those of the next VALID token), and both bootstrap
    to 0 after the last valid token (the response ended). Same recursion as verl
    ``compute_gae_advantage_return`` / TRL ``PPOTrainer``, without the whitening.
    """
    token_rewards = _token_rewards(token_rewards, scores, mask)
    if values is None or values.shape != token_rewards.shape:
        got = None if values is None else tuple(values.shape)
        raise ValueError(f"GAE needs values of shape {tuple(token_rewards.shape)} from a critic, got {got}")
    m = _float_mask(mask, token_rewards)
    batch, length = token_rewards.shape
    next_value = token_rewards.new_zeros(batch)
    next_adv = token_rewards.new_zeros(batch)
    advantages = torch.zeros_like(token_rewards)
    for t in reversed(range(length)):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        valid = m[:, t] != 0
        next_value = torch.where(valid, values[:, t], next_value)
        next_adv = torch.where(valid, adv_t, next_adv)
        advantages[:, t] = torch.where(valid, adv_t, torch.zeros_like(adv_t))
    returns = (advantages + values) * m
    return advantages, returns


@register_advantage("grpo")
@torch.no_grad()
def compute_grpo(scores, mask, group_size: int, norm_by_std: bool = True, eps: float = 1e-6, token_rewards=None, **_):
    """Group Relative Policy Optimization outcome advantage (DeepSeekMath, arXiv:2402.03300).

    For response ``i`` of a group of ``G = group_size`` contiguous rows with sequence scores ``s``
    (row sums of ``token_rewards``, else ``scores``; see the module docstring):
    ``A_i = (s_i - mean(s)) / (std(s) + eps)`` (``std`` with Bessel's correction, as verl's
    ``compute_grpo_outcome_advantage`` via ``torch.std``); with ``norm_by_std=False``,
    ``A_i = s_i - mean(s)`` (Dr. GRPO, arXiv:2503.20783). ``A_i`` is broadcast over the
    response tokens (times ``mask``); returns equal advantages. A group of identical scores gets
    advantage 0. ``group_size=1`` follows verl: mean 0, std 1, so ``A_i = s_i``.
    """
    grouped, group_size = _grouped_scores(scores, token_rewards, mask, group_size)
    if group_size == 1:
        adv = grouped.reshape(-1)
    else:
        centered = grouped - grouped.mean(dim=-1, keepdim=True)
        if norm_by_std:
            centered = centered / (grouped.std(dim=-1, keepdim=True) + eps)
        adv = centered.reshape(-1)
    advantages = adv.unsqueeze(-1) * _float_mask(mask, adv)
    return advantages, advantages.clone()


@register_advantage("rloo")
@torch.no_grad()
def compute_rloo(scores, mask, group_size: int, token_rewards=None, **_):
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024, arXiv:2402.14740; Kool et al. 2019).

    Sequence scores ``s`` are row sums of ``token_rewards`` (else ``scores``), as for GRPO.
    Baseline for response ``i`` is the mean score of the OTHER ``G - 1`` responses of its group:
    ``A_i = s_i - (sum_j s_j - s_i) / (G - 1) = G / (G - 1) * (s_i - mean(s))``. Broadcast over
    the response tokens (times ``mask``); returns equal advantages. ``group_size=1`` has no other
    response to compare with and follows verl: ``A_i = s_i``.
    """
    grouped, group_size = _grouped_scores(scores, token_rewards, mask, group_size)
    if group_size == 1:
        adv = grouped.reshape(-1)
    else:
        others_mean = (grouped.sum(dim=-1, keepdim=True) - grouped) / (group_size - 1)
        adv = (grouped - others_mean).reshape(-1)
    advantages = adv.unsqueeze(-1) * _float_mask(mask, adv)
    return advantages, advantages.clone()


@register_advantage("reinforce_plus_plus")
@torch.no_grad()
def compute_reinforce_plus_plus(token_rewards, mask, gamma: float = 1.0, scores=None, **_):
    """REINFORCE++ (Hu 2025, arXiv:2501.03262; verl ``compute_reinforce_plus_plus_outcome_advantage``).

    Discounted return-to-go over valid tokens, ``G_t = r_t + gamma * G_{t'}`` with ``t'`` the next
    VALID token (padded positions are skipped, as in GAE and verl 0.9.1: their rewards are ignored
    and the running return passes through them), 0 after the last valid token; then whitened over
    all valid tokens of the batch: ``A = (G - mean(G)) / sqrt(var(G) + 1e-8)`` (masked, unbiased
    variance). Returns ``G`` (0 on padding).
    """
    token_rewards = _token_rewards(token_rewards, scores, mask)
    m = _float_mask(mask, token_rewards)
    returns = torch.zeros_like(token_rewards)
    running = token_rewards.new_zeros(token_rewards.shape[0])
    for t in reversed(range(token_rewards.shape[1])):
        valid = m[:, t] != 0
        running = torch.where(valid, token_rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(valid, running, torch.zeros_like(running))
    advantages = masked_whiten(returns, m) * m
    return advantages, returns
