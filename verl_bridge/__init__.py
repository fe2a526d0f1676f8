"""verl-bridge: RL post-training (PPO, GRPO, RLOO, REINFORCE++) for Megatron-LM / megatron-core users.

Public API (imported lazily so ``import verl_bridge`` and ``verl-bridge --help`` stay light)::

    from verl_bridge import MegatronTrainer, MegatronBridge, load_config
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "MegatronTrainer": "verl_bridge.runtime.trainer",
    "MegatronBridge": "verl_bridge.bridge.core",
    "load_config": "verl_bridge.config.loader",
    "Config": "verl_bridge.config.schema",
    "ConfigError": "verl_bridge.config.loader",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'verl_bridge' has no attribute {name!r}")
