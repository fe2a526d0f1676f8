"""KL coefficient controllers and the KL-in-reward penalty.

With ``algorithm.kl.placement: reward`` the trainer turns sequence scores into token rewards
with :func:`apply_kl_to_rewards` (``-kl_coef * kl`` on every token, the score on the last one)
and then calls ``controller.update(kl_mean, n_steps)`` once per step. A fixed controller keeps
its coefficient; an adaptive one steers the measured KL towards ``algorithm.kl.target``.
Controllers save and restore through ``state_dict()`` / ``load_state_dict()`` so a resumed run
continues with the adapted coefficient.
"""

from __future__ import annotations

import torch

from verl_bridge.algorithms.core import masked_mean, scores_to_token_rewards
from verl_bridge.algorithms.losses import kl_penalty

# Default horizon of Ziegler et al.'s lm-human-preferences (and verl's kl_ctrl.horizon).
DEFAULT_KL_HORIZON = 10000


class FixedKLController:
    """A constant KL coefficient: ``update`` does nothing."""

    def __init__(self, kl_coef: float):
        if kl_coef < 0:
            raise ValueError(f"KL coefficient must be >= 0, got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op; present so the trainer treats both controllers alike."""

    def state_dict(self) -> dict:
        return {"type": "fixed", "value": self.value}

    def load_state_dict(self, state: dict) -> None:
        _check_type(state, "fixed")
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, arXiv:1909.08593, sec. 2.2; TRL / verl).

    After a step that measured ``current_kl`` over ``n_steps`` samples::

        e = clip(current_kl / target - 1, -0.2, 0.2)
        value *= 1 + e * n_steps / horizon

    so the coefficient grows while KL is above target and shrinks while below, by at most
    20 % of ``n_steps / horizon`` per update.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int = DEFAULT_KL_HORIZON):
        if init_kl_coef < 0:
            raise ValueError(f"KL coefficient must be >= 0, got {init_kl_coef}")
        if target <= 0:
            raise ValueError(f"adaptive KL target must be > 0, got {target}")
        if horizon <= 0:
            raise ValueError(f"adaptive KL horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"type": "adaptive", "value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        _check_type(state, "adaptive")
        self.value = float(state["value"])
        self.target = float(state.get("target", self.target))
        self.horizon = state.get("horizon", self.horizon)


def _check_type(state: dict, expected: str) -> None:
    found = state.get("type", expected)
    if found != expected:
        raise ValueError(
            f"cannot load a {found!r} KL controller state into a {expected!r} controller; "
            f"set algorithm.kl.target consistently with the checkpoint"
        )


def build_kl_controller(coef: float, target: float | None = None, horizon: int | None = None):
    """An :class:`AdaptiveKLController` when ``target`` is set, else a :class:`FixedKLController`.

    ``horizon`` defaults to 10000 (Ziegler et al.'s value) for the adaptive controller.
    """
    if target is None:
        return FixedKLController(coef)
    return AdaptiveKLController(coef, target, DEFAULT_KL_HORIZON if horizon is None else horizon)


@torch.no_grad()
def apply_kl_to_rewards(
    scores: torch.Tensor,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    estimator: str,
) -> tuple[torch.Tensor, float]:
    """Token rewards with a KL penalty (Ziegler et al. 2019; verl ``apply_kl_penalty``).

    ``token_rewards[i, t] = -kl_coef * kl[i, t] * mask[i, t]``, plus ``scores[i]`` on the last
    valid token of row ``i``, where ``kl`` is :func:`~verl_bridge.algorithms.losses.kl_penalty`
    with ``estimator``. Also returns the KL to feed the controller and the metrics: the mean over
    sequences of each sequence's token-mean KL (a Python float; rows with no valid token are
    left out).
    """
    if log_prob.shape != mask.shape or ref_log_prob.shape != mask.shape:
        raise ValueError(
            f"log_prob {tuple(log_prob.shape)}, ref_log_prob {tuple(ref_log_prob.shape)} and "
            f"mask {tuple(mask.shape)} must have the same [B, T] shape"
        )
    m = mask.to(log_prob.dtype)
    kl = torch.where(m != 0, kl_penalty(log_prob, ref_log_prob, estimator), torch.zeros_like(log_prob))
    token_rewards = scores_to_token_rewards(scores.to(log_prob.dtype), m) - kl_coef * kl * m
    per_seq = masked_mean(kl, m, dim=-1)
    kl_mean = masked_mean(per_seq, (m != 0).any(dim=-1))
    return token_rewards, float(kl_mean)
