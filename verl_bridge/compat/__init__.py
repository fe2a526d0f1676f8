"""Version and device shims, in one place; each names the megatron-core versions it serves.

* :mod:`.mcore_versions`: the installed megatron-core version, the supported range (0.12-0.19) and
  the shims switched at the version where an API changed (``vp_stage`` since 0.13,
  ``ProcessGroupCollection`` since 0.15, RoPE ``get_emb`` since 0.16, ``GPTModel`` deprecation
  since 0.19);
* :mod:`.cpu`: megatron-core 0.12-0.19 modules that assume CUDA (RoPE, attention KV cache, vocab
  gather; RoPE ``forward`` before 0.16) made to run on the CPU: :func:`make_cpu_safe`.

None of them patches a library module; each acts on objects verl-bridge or the user built.
"""

from __future__ import annotations

import torch

from verl_bridge.compat.cpu import make_cpu_safe  # noqa: F401


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """Strip DDP / Float16Module-style ``.module`` wrappers down to the model itself."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model
