"""Name -> function registries for advantage estimators, policy losses and KL estimators, and the
algorithm specs (``algorithm.name`` -> :class:`AlgorithmSpec`).

The trainer looks algorithms up by the names in its config (``algorithm.name``,
``algorithm.kl.estimator``); the config validator reads the same :data:`ALGORITHMS` registry
(this module imports no torch, so validation stays light). A registry is a plain ``dict``; looking up a name that is not
registered raises :class:`UnknownNameError` (both a ``ValueError`` and a ``KeyError``) whose
message lists the registered names, so a typo in a config reads as one clear sentence.

Adding an algorithm is one decorated function::

    @register_advantage("my_estimator")
    def compute_my_estimator(token_rewards, mask, **_):
        ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


class UnknownNameError(ValueError, KeyError):
    """A name that is not in a registry. ``str()`` is the plain message (not KeyError's repr)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class Registry(dict):
    """A ``dict`` whose failed lookups name the registry and list what is allowed."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def __missing__(self, name):
        raise UnknownNameError(
            f"unknown {self.kind} {name!r}; allowed: {', '.join(sorted(self)) or '(none registered)'}"
        )

    def register(self, name: str) -> Callable[[F], F]:
        def decorator(fn: F) -> F:
            if name in self and self[name] is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered as "
                                 f"{getattr(self[name], '__qualname__', self[name])!r}")
            self[name] = fn
            return fn

        return decorator


ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator")
POLICY_LOSSES: Registry = Registry("policy loss")
KL_ESTIMATORS: Registry = Registry("KL estimator")

# Estimators whose advantages are computed from a learned value function.
_CRITIC_ESTIMATORS: set[str] = set()


def register_advantage(name: str, *, needs_critic: bool = False) -> Callable[[F], F]:
    """Register an advantage estimator under ``name``.

    The trainer calls every estimator with the same keyword arguments
    (``token_rewards, values, scores, mask, gamma, lam, group_size, norm_by_std``), so the
    function must accept ``**kwargs`` and ignore what it does not use. It returns
    ``(advantages, returns)``, both ``[B, T]``.
    """
    inner = ADVANTAGE_ESTIMATORS.register(name)

    def decorator(fn: F) -> F:
        inner(fn)
        if needs_critic:
            _CRITIC_ESTIMATORS.add(name)
        return fn

    return decorator


def register_policy_loss(name: str) -> Callable[[F], F]:
    """Register a policy loss with :func:`~verl_bridge.algorithms.losses.ppo_policy_loss`'s signature."""
    return POLICY_LOSSES.register(name)


def register_kl(name: str) -> Callable[[F], F]:
    """Register a per-token KL estimator ``(log_prob, ref_log_prob) -> kl [B, T]``."""
    return KL_ESTIMATORS.register(name)


def needs_critic(name: str) -> bool:
    """True when the advantage estimator ``name`` needs a critic (value model): only ``"gae"``."""
    return name in ADVANTAGE_ESTIMATORS and name in _CRITIC_ESTIMATORS


@dataclass(frozen=True)
class AlgorithmSpec:
    """What ``algorithm.name`` means: the estimator, the policy loss, and what the config must allow.

    ``advantage`` and ``policy_loss`` are names in :data:`ADVANTAGE_ESTIMATORS` and
    :data:`POLICY_LOSSES`; ``needs_critic`` says the estimator reads a value model (the validator
    asks for ``model.critic``); ``kl_placements`` are the allowed ``algorithm.kl.placement``
    values; ``min_group_size`` is the smallest ``algorithm.group_size`` the estimator works with.
    """

    name: str
    advantage: str
    needs_critic: bool = False
    policy_loss: str = "ppo"
    kl_placements: tuple[str, ...] = ("reward", "loss")
    min_group_size: int = 1


ALGORITHMS: Registry = Registry("algorithm")


def register_algorithm(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Register ``spec`` under ``spec.name`` (``algorithm.name`` in a config)."""
    ALGORITHMS.register(spec.name)(spec)
    return spec


# the shipped algorithms; the functions they name are registered by advantages.py and losses.py
register_algorithm(AlgorithmSpec("ppo", advantage="gae", needs_critic=True))
register_algorithm(AlgorithmSpec("grpo", advantage="grpo", min_group_size=2))
register_algorithm(AlgorithmSpec("rloo", advantage="rloo", min_group_size=2))
register_algorithm(AlgorithmSpec("reinforce_plus_plus", advantage="reinforce_plus_plus"))
