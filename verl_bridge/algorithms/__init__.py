"""RL algorithms as small registered torch functions (no Megatron, no distributed code).

- :mod:`.advantages`: GAE, GRPO, RLOO, REINFORCE++ -> ``ADVANTAGE_ESTIMATORS``
- :mod:`.losses`: PPO clipped / dual-clip policy loss -> ``POLICY_LOSSES``, value loss,
  entropy, KL estimators k1 / k2 / k3 -> ``KL_ESTIMATORS``
- :mod:`.kl_control`: fixed / adaptive KL coefficient, KL penalty in the reward
- :mod:`.core`: masked reductions, whitening, loss aggregation (``LOSS_AGG_MODES``, ``GlobalBatch``)

- :mod:`.registry`: the registries and :data:`ALGORITHMS` (``algorithm.name`` -> :class:`AlgorithmSpec`)

Registries are dicts; an unknown name raises ``ValueError`` listing the allowed names.
The torch modules are imported on first use of a name from this package, so the config
validator can read :mod:`.registry` without importing torch.
"""

from __future__ import annotations

import importlib

from verl_bridge.algorithms.registry import ALGORITHMS, AlgorithmSpec, UnknownNameError, register_algorithm

# name -> the module defining it; the first lookup of any of them imports all the torch modules, so the
# function registries are complete whenever one is looked up
_TORCH_NAMES = {
    "verl_bridge.algorithms.registry": ("ADVANTAGE_ESTIMATORS", "KL_ESTIMATORS", "POLICY_LOSSES", "needs_critic",
                                        "register_advantage", "register_kl", "register_policy_loss"),
    "verl_bridge.algorithms.core": ("LOSS_AGG_MODES", "GlobalBatch", "aggregate_loss", "last_token_index", "masked_mean",
                                    "masked_sum", "masked_var", "masked_whiten", "scores_to_token_rewards"),
    "verl_bridge.algorithms.advantages": ("compute_gae", "compute_grpo", "compute_reinforce_plus_plus",
                                          "compute_rloo"),
    "verl_bridge.algorithms.losses": ("entropy_from_logits", "kl_k1", "kl_k2", "kl_k3", "kl_penalty",
                                      "ppo_policy_loss", "value_loss"),
    "verl_bridge.algorithms.kl_control": ("AdaptiveKLController", "FixedKLController", "apply_kl_to_rewards",
                                          "build_kl_controller"),
}


def load_all() -> None:
    """Import the torch modules, which fill the estimator / loss / KL registries."""
    for module in _TORCH_NAMES:  # registry first, then the modules that register into it
        importlib.import_module(module)


def __getattr__(name: str):
    for module, names in _TORCH_NAMES.items():
        if name in names:
            load_all()
            return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'verl_bridge.algorithms' has no attribute {name!r}")


__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ALGORITHMS",
    "AlgorithmSpec",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "FixedKLController",
    "GlobalBatch",
    "UnknownNameError",
    "aggregate_loss",
    "apply_kl_to_rewards",
    "build_kl_controller",
    "compute_gae",
    "compute_grpo",
    "compute_reinforce_plus_plus",
    "compute_rloo",
    "entropy_from_logits",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_penalty",
    "last_token_index",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "needs_critic",
    "ppo_policy_loss",
    "register_advantage",
    "register_algorithm",
    "register_kl",
    "register_policy_loss",
    "scores_to_token_rewards",
    "value_loss",
]
