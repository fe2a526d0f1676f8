"""Resolve ``"module:function"`` hook strings (reward functions, model providers, ...)."""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Callable, Optional

# short names accepted by ``model.reward.args.path`` for the built-in rule rewards
BUILTIN_REWARDS = {
    "gsm8k": "verl_bridge.rewards.gsm8k:compute_score",
    "gsm8k_flexible": "verl_bridge.rewards.gsm8k:compute_score_flexible",
}


def resolve_callable(spec: str, source_dir: Optional[str] = None, what: str = "function") -> Callable:
    """Import ``module:function``; ``source_dir`` (the config's directory) is searched first."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ValueError(f"{what} {spec!r}: expected 'module:function'")
    module_name, attr = spec.split(":")
    if source_dir and source_dir not in sys.path:
        sys.path.insert(0, source_dir)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{what} {spec!r}: cannot import module '{module_name}': {exc}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{what} {spec!r}: module '{module_name}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{what} {spec!r}: '{attr}' is not callable")
    return obj


def _wants_extra(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "extra" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def with_extra_fields(fn: Callable) -> Callable[[str, str], float]:
    """``fn(response, ground_truth)``; a ``fn`` taking ``extra`` (or ``**kwargs``) also gets the
    sample's other fields (``ground_truth.extra``, see :class:`verl_bridge.data.GroundTruth`)."""
    if not _wants_extra(fn):
        return fn

    def reward(response: str, ground_truth: str) -> float:
        return fn(response, ground_truth, extra=dict(getattr(ground_truth, "extra", None) or {}))

    reward.__wrapped__ = fn
    return reward


def load_reward_fn(spec: str, source_dir: Optional[str] = None) -> Callable[[str, str], float]:
    """A ``"module:function"`` or a built-in name (``gsm8k``, ``gsm8k_flexible``) as a two-argument reward."""
    spec = BUILTIN_REWARDS.get(spec, spec)
    return with_extra_fields(resolve_callable(spec, source_dir, what="model.reward.args.path"))
