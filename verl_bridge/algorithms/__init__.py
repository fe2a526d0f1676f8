"""RL algorithms as small registered torch functions (no Megatron, no distributed code).

- :mod:`.advantages`: GAE, GRPO, RLOO, REINFORCE++ -> ``ADVANTAGE_ESTIMATORS``
- :mod:`.losses`: PPO clipped / dual-clip policy loss -> ``POLICY_LOSSES``, value loss,
  entropy, KL estimators k1 / k2 / k3 -> ``KL_ESTIMATORS``
- :mod:`.kl_control`: fixed / adaptive KL coefficient, KL penalty in the reward
- :mod:`.core`: masked reductions, whitening, loss aggregation (``LOSS_AGG_MODES``)

Registries are dicts; an unknown name raises ``ValueError`` listing the allowed names.
"""

from verl_bridge.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    UnknownNameError,
    needs_critic,
    register_advantage,
    register_kl,
    register_policy_loss,
)
from verl_bridge.algorithms.core import (
    LOSS_AGG_MODES,
    aggregate_loss,
    last_token_index,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    scores_to_token_rewards,
)
from verl_bridge.algorithms.advantages import (
    compute_gae,
    compute_grpo,
    compute_reinforce_plus_plus,
    compute_rloo,
)
from verl_bridge.algorithms.losses import (
    entropy_from_logits,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_penalty,
    ppo_policy_loss,
    value_loss,
)
from verl_bridge.algorithms.kl_control import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_to_rewards,
    build_kl_controller,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "FixedKLController",
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
    "register_kl",
    "register_policy_loss",
    "scores_to_token_rewards",
    "value_loss",
]
