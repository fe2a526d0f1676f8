"""Rollout-training mismatch: how far the engine that sampled is from the trainer that learns.

The rollout engine (vLLM, or the native engine's KV-cache path) and the trainer's forward are two
computations of "the same" policy; kernels, precision and a stale sync make them differ. Per
response token, with ``lp_rollout`` the log-probability the engine sampled the token with and
``lp_train`` the trainer's (old, pre-update) log-probability of it:

* ``mismatch/logprob_abs_mean`` = mean ``|lp_rollout - lp_train|``;
* ``mismatch/kl_k3`` = mean of the k3 estimator of KL(rollout || train) on the rollout's own
  samples: ``r - 1 - log r`` with ``log r = lp_train - lp_rollout`` (>= 0, 0 when they agree).

**Truncated importance sampling** (``algorithm.rollout_correction: {type: tis, cap: 2.0}``, off by
default): the samples come from the rollout policy while PPO's ratio is taken against the
trainer's old policy, so each token's policy-gradient loss is weighted by
``w = min(exp(lp_train_old - lp_rollout), cap)`` (no gradient through ``w``), as in "Your Efficient
RL Framework Secretly Brings You Off-Policy RL Training" (Yao et al., 2025) and verl's
``rollout_is``.
"""

from __future__ import annotations

import torch

from verl_bridge.algorithms.core import masked_mean
from verl_bridge.algorithms.losses import kl_k3

def rollout_mismatch(rollout_log_probs: torch.Tensor, train_log_probs: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, float]:
    """``mismatch/logprob_abs_mean`` and ``mismatch/kl_k3`` over the tokens where ``mask`` is 1."""
    rollout = rollout_log_probs.detach().double()
    train = train_log_probs.detach().double()
    # k3 of KL(rollout || train): kl_k3(log_prob=sampling policy, ref_log_prob=other policy); >= 0 in
    # exact arithmetic, so the rounding of exp(d) - 1 - d for d ~ 1e-7 is clamped away
    k3 = kl_k3(rollout, train).clamp(min=0.0)
    return {
        "mismatch/logprob_abs_mean": float(masked_mean((rollout - train).abs(), mask.double())),
        "mismatch/kl_k3": float(masked_mean(k3, mask.double())),
    }


def tis_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, cap: float) -> torch.Tensor:
    """Per-token truncated importance weights ``min(exp(old - rollout), cap)``, without gradient.

    The log-ratio is clamped at 20 before ``exp`` (as every ratio in :mod:`verl_bridge.algorithms.losses`).
    """
    if not cap > 0:
        raise ValueError(f"the TIS cap must be > 0, got {cap}")
    log_ratio = torch.clamp(old_log_probs.detach().float() - rollout_log_probs.detach().float(), max=20.0)
    return torch.clamp(torch.exp(log_ratio), max=float(cap))


__all__ = ["rollout_mismatch", "tis_weights"]
