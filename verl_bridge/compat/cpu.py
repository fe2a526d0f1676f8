"""CPU shims: megatron-core 0.12-0.19 modules that assume CUDA, made to run where their weights are.

Each shim says which megatron-core versions it is for and what it changes. Nothing here patches
a library module globally: shims act only on objects verl-bridge (or the user's provider) built,
by swapping the class of those modules for a subclass. :func:`make_cpu_safe` applies all of them
(and, before 0.16, the RoPE ``forward`` fix of :data:`verl_bridge.compat.mcore_versions.ROPE_GET_EMB_SINCE`).
"""

from __future__ import annotations

import torch

from verl_bridge.compat.mcore_versions import ROPE_GET_EMB_SINCE, mcore_version


def _cpu_safe_rotary_class(base: type) -> type:
    """RotaryEmbedding whose ``get_emb`` keeps ``inv_freq`` where the model is.

    megatron-core 0.12-0.19 ``RotaryEmbedding.get_emb`` moves ``inv_freq`` to
    ``torch.cuda.current_device()`` whenever it sits on the CPU, which raises on a CPU-only
    machine. This subclass computes the same embedding without the move.
    """

    class CpuSafeRotaryEmbedding(base):  # type: ignore[misc, valid-type]
        def get_emb(self, max_seq_len: int, offset: int = 0):
            freqs = self.get_freqs_non_repeated(max_seq_len, offset)
            if not self.rotary_interleaved:
                emb = torch.cat((freqs, freqs), dim=-1)
            else:
                emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
            return emb[:, None, None, :]

    CpuSafeRotaryEmbedding.__name__ = f"CpuSafe{base.__name__}"
    return CpuSafeRotaryEmbedding


_ROTARY_CLASSES: dict[type, type] = {}
_ATTENTION_CLASSES: dict[type, type] = {}


def _cpu_safe_attention_class(base: type) -> type:
    """Attention whose inference KV cache is allocated where the module's weights are.

    megatron-core 0.12-0.19 ``Attention._allocate_memory`` allocates the static-batching KV cache
    on ``torch.cuda.current_device()``; on a CPU-only machine that raises.
    """

    class CpuSafeAttention(base):  # type: ignore[misc, valid-type]
        def _allocate_memory(self, inference_max_sequence_length, batch_size, dim, dtype):
            device = next(self.parameters()).device
            return torch.empty(
                inference_max_sequence_length, batch_size, self.num_query_groups_per_partition, dim,
                dtype=dtype, device=device,
            )

    CpuSafeAttention.__name__ = f"CpuSafe{base.__name__}"
    return CpuSafeAttention


_OUTPUT_CLASSES: dict[type, type] = {}


def _cpu_safe_output_layer_class(base: type) -> type:
    """ColumnParallelLinear whose optional vocab gather runs on the CPU.

    megatron-core 0.12-0.19 ``_gather_along_last_dim`` allocates its output on
    ``torch.cuda.current_device()``; GPTModel asks for that gather in inference mode with TP > 1.
    This subclass computes the local shard and gathers it with
    ``torch.distributed.nn.functional.all_gather`` (differentiable, any backend).
    """

    class CpuSafeOutputLayer(base):  # type: ignore[misc, valid-type]
        def forward(self, input_, weight=None, runtime_gather_output=None, **kwargs):
            gather = self.gather_output if runtime_gather_output is None else runtime_gather_output
            out, bias = super().forward(input_, weight=weight, runtime_gather_output=False, **kwargs)
            if gather and self.tp_group is not None and self.tp_group.size() > 1:
                if torch.is_grad_enabled() and out.requires_grad:
                    import torch.distributed.nn.functional as dfn

                    parts = dfn.all_gather(out.contiguous(), group=self.tp_group)
                else:
                    parts = [torch.empty_like(out) for _ in range(self.tp_group.size())]
                    torch.distributed.all_gather(parts, out.contiguous(), group=self.tp_group)
                out = torch.cat(parts, dim=-1)
            return out, bias

    CpuSafeOutputLayer.__name__ = f"CpuSafe{base.__name__}"
    return CpuSafeOutputLayer


_ROPE_PRE_016: dict[type, type] = {}


def rope_forward_pre_0_16(self, max_seq_len: int, offset: int = 0, packed_seq: bool = False, **_):
    """0.12-0.15 ``RotaryEmbedding.forward`` minus its ``inv_freq.to(cuda)`` (CPU, no context parallel)."""
    freqs = self.get_freqs_non_repeated(max_seq_len, offset)
    if not self.rotary_interleaved:
        emb = torch.cat((freqs, freqs), dim=-1)
    else:
        emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
    cp_group = getattr(self, "cp_group", None)
    if cp_group is not None and cp_group.size() > 1:
        raise RuntimeError("context parallelism needs CUDA")
    return emb[:, None, None, :]


def make_cpu_safe(model: torch.nn.Module) -> torch.nn.Module:
    """Swap the class of *model*'s rotary, attention and output-layer modules for CPU-safe subclasses.

    Only needed when CUDA is unavailable; a no-op otherwise. Acts on this model's modules only.
    MoE models also get :func:`verl_bridge.compat.moe.make_router_cpu_safe` (the router's gating).
    """
    from verl_bridge.compat.moe import make_router_cpu_safe

    make_router_cpu_safe(model)
    _make_cpu_safe_0_12_to_0_19(model)
    if torch.cuda.is_available() or mcore_version() >= ROPE_GET_EMB_SINCE:
        return model
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    for module in model.modules():
        cls = type(module)
        if isinstance(module, RotaryEmbedding) and cls not in _ROPE_PRE_016.values():
            if cls not in _ROPE_PRE_016:
                # the name keeps the "CpuSafe" prefix so a second make_cpu_safe leaves it alone
                _ROPE_PRE_016[cls] = type(f"{cls.__name__}_mcore_pre_0_16", (cls,),
                                          {"forward": rope_forward_pre_0_16})
            module.__class__ = _ROPE_PRE_016[cls]
    return model


def _make_cpu_safe_0_12_to_0_19(model: torch.nn.Module) -> None:
    """The rotary / output-layer / attention class swaps (every megatron-core 0.12-0.19)."""
    if torch.cuda.is_available():
        return
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.tensor_parallel import ColumnParallelLinear
    from megatron.core.transformer.attention import Attention

    for module in model.modules():
        cls = type(module)
        if cls.__name__.startswith("CpuSafe"):
            continue
        if isinstance(module, RotaryEmbedding):
            if cls not in _ROTARY_CLASSES:
                _ROTARY_CLASSES[cls] = _cpu_safe_rotary_class(cls)
            module.__class__ = _ROTARY_CLASSES[cls]
        elif isinstance(module, ColumnParallelLinear) and module is getattr(model, "output_layer", None):
            if cls not in _OUTPUT_CLASSES:
                _OUTPUT_CLASSES[cls] = _cpu_safe_output_layer_class(cls)
            module.__class__ = _OUTPUT_CLASSES[cls]
        elif isinstance(module, Attention):
            if cls not in _ATTENTION_CLASSES:
                _ATTENTION_CLASSES[cls] = _cpu_safe_attention_class(cls)
            module.__class__ = _ATTENTION_CLASSES[cls]
