"""Per-token losses: PPO clipped policy loss (with dual clip), clipped value loss, entropy, KL.

Shapes are ``[B, T]`` over response tokens with ``mask`` 1 on real tokens. Each loss returns
``(scalar_loss, stats)`` where ``stats`` maps metric names to Python floats; the scalar is
reduced with :func:`~verl_bridge.algorithms.core.aggregate_loss`.
"""

from __future__ import annotations

import torch

from verl_bridge.algorithms.core import GlobalBatch, aggregate_loss, masked_mean
from verl_bridge.algorithms.registry import KL_ESTIMATORS, register_kl, register_policy_loss

# exp() of a log-ratio beyond this overflows float32; verl clamps at the same bound.
_LOG_RATIO_CLAMP = 20.0
# verl's bound on the k3 ("low_var_kl") estimate.
_K3_CLAMP = 10.0


@register_policy_loss("ppo")
def ppo_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    dual_clip_c: float | None = None,
    loss_agg_mode: str = "token-mean",
    global_batch: GlobalBatch | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347), optionally dual-clipped.

    With ``r = exp(log_prob - old_log_prob)`` (log-ratio clamped to +-20) and advantage ``A``:

    - ``L_clip = max(-A * r, -A * clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))``
      (asymmetric bounds as in DAPO's clip-higher, arXiv:2503.14476);
    - dual clip (Ye et al. 2020, arXiv:1912.09729), when ``dual_clip_c`` (> 1) is set: for
      ``A < 0`` the loss is additionally capped, ``L = min(L_clip, -A * c)``, so a huge ratio on
      a bad action cannot blow the loss up.

    Same formulas as verl ``compute_policy_loss_vanilla``. Stats (masked token means):
    ``pg_clipfrac`` (tokens where the clipped term is the larger one), ``ppo_kl``
    (``mean(old_log_prob - log_prob)``, the k1 estimate of KL(old || new)),
    ``pg_clipfrac_lower`` (tokens where the dual clip bound is active; 0 without dual clip).
    ``global_batch``: see :func:`~verl_bridge.algorithms.core.aggregate_loss` (the loss is then
    this micro-batch's share of the mini-batch's loss).
    ``token_weights`` ``[B, T]`` (no gradient) multiply each token's loss before aggregation
    (truncated importance sampling, as verl's ``rollout_is_weights``).
    """
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1 (the ratio bound for negative advantages), got {dual_clip_c}")
    if clip_ratio_low < 0 or clip_ratio_high < 0:
        raise ValueError(f"clip ratios must be >= 0, got low={clip_ratio_low}, high={clip_ratio_high}")
    log_ratio = torch.clamp(log_prob - old_log_prob, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    losses = torch.maximum(unclipped, clipped)
    clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), mask)
    if dual_clip_c is None:
        clipfrac_lower = torch.zeros(())
    else:
        bound = -advantages * dual_clip_c
        negative = advantages < 0
        clipfrac_lower = masked_mean((torch.gt(losses, bound) & negative).float(), mask)
        losses = torch.where(negative, torch.minimum(losses, bound), losses)
    if token_weights is not None:  # e.g. truncated importance weights (algorithms/rollout_correction.py)
        losses = losses * token_weights.detach()
    loss = aggregate_loss(losses, mask, loss_agg_mode, global_batch)
    with torch.no_grad():
        stats = {
            "pg_clipfrac": float(clipfrac),
            "ppo_kl": float(masked_mean(-log_ratio, mask)),
            "pg_clipfrac_lower": float(clipfrac_lower),
        }
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float | None = 0.2,
    loss_agg_mode: str = "token-mean",
    global_batch: GlobalBatch | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss of PPO's critic (as in OpenAI baselines ppo2 / verl ``compute_value_loss``).

    ``v_clip = old_values + clip(values - old_values, -clip_range, clip_range)``;
    per token ``0.5 * max((values - returns)^2, (v_clip - returns)^2)``, aggregated with
    ``loss_agg_mode`` (over ``global_batch`` when given, as in :func:`ppo_policy_loss`). ``clip_range=None`` gives the plain ``0.5 * (values - returns)^2``.
    ``values`` are the critic's current predictions, ``old_values`` those at rollout time.
    Stats: ``vf_clipfrac`` (tokens where the clipped error is the larger one), ``vpred_mean``.
    """
    unclipped = (values - returns) ** 2
    if clip_range is None:
        losses = unclipped
        clipfrac = torch.zeros(())
    else:
        if clip_range < 0:
            raise ValueError(f"value clip_range must be >= 0 or None, got {clip_range}")
        v_clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
        clipped = (v_clipped - returns) ** 2
        losses = torch.maximum(unclipped, clipped)
        clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), mask)
    loss = 0.5 * aggregate_loss(losses, mask, loss_agg_mode, global_batch)
    with torch.no_grad():
        stats = {"vf_clipfrac": float(clipfrac), "vpred_mean": float(masked_mean(values, mask))}
    return loss, stats


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution over the last dim: ``[..., V] -> [...]``.

    ``H = -sum_v p_v log p_v = logsumexp(z) - sum_v softmax(z)_v z_v`` (verl
    ``entropy_from_logits``), computed in float32 at least.
    """
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    probs = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (probs * z).sum(dim=-1)


# KL estimators (Schulman, "Approximating KL divergence", 2020,
# http://joschu.net/blog/kl-approx.html). Tokens are sampled from the policy pi, and with
# log r = log pi_ref(x) - log pi(x), each estimates KL(pi || pi_ref) per token.


@register_kl("k1")
def kl_k1(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k1 = ``log pi - log pi_ref`` = ``-log r``: unbiased, high variance, can be negative."""
    return log_prob - ref_log_prob


@register_kl("k2")
def kl_k2(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k2 = ``0.5 * (log r)^2``: biased, low variance, always >= 0 (verl's ``mse``)."""
    return 0.5 * (log_prob - ref_log_prob) ** 2


@register_kl("k3")
def kl_k3(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k3 = ``(r - 1) - log r``: unbiased, low variance, always >= 0 (verl's ``low_var_kl``).

    As verl: ``log r`` clamped to +-20 before ``exp``, the estimate clamped to [-10, 10].
    """
    log_r = torch.clamp(ref_log_prob - log_prob, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(log_r) - log_r - 1.0, -_K3_CLAMP, _K3_CLAMP)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate ``[B, T]`` with ``estimator`` in k1 / k2 / k3.

    Unknown names raise ``ValueError`` listing the registered estimators.
    """
    return KL_ESTIMATORS[estimator](log_prob, ref_log_prob)
