"""Resolve ``"module:function"`` hook strings (reward functions, model providers, ...)."""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Optional


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


def load_reward_fn(spec: str, source_dir: Optional[str] = None) -> Callable[[str, str], float]:
    return resolve_callable(spec, source_dir, what="model.reward.args.path")
