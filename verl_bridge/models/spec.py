"""A portable megatron-core GPT layer spec: runs on CPU and lets SDPA pick flash attention on GPU.

megatron-core's *local* spec (``get_gpt_layer_local_spec``) uses ``DotProductAttention``, which
assumes CUDA in two places: it takes its score buffer from a CUDA memory buffer
(``get_global_memory_buffer``) and builds the causal mask on CUDA. The Transformer Engine spec
needs TE. This module keeps every other piece of the local spec (ColumnParallelLinear,
RowParallelLinear, the local norms, the MLP) and swaps only ``core_attention`` for
:class:`SDPAttention`, a module with the same constructor and forward contract built on
``torch.nn.functional.scaled_dot_product_attention``. The result is a real megatron-core
``GPTModel`` that trains forward and backward on CPU (TP=1 and TP>1 over gloo) and, on CUDA,
dispatches to the flash / memory-efficient SDPA kernels without Transformer Engine or apex.

CUDA assumptions that remain in megatron-core (and how verl-bridge avoids them on CPU):

* the pipeline schedules for PP>1 (``forward_backward_pipelining_*``) allocate P2P buffers on
  CUDA: on CPU they run through the shims of :mod:`verl_bridge.compat.pipeline`.
* megatron's torch norm (``WrappedTorchNorm``, the local spec's norm without apex) refuses
  sequence parallelism: the portable spec uses :class:`PortableNorm` (torch ``LayerNorm`` /
  ``RMSNorm`` whose weights carry megatron's ``sequence_parallel`` tag, so the SP gradient
  all-reduce over TP includes them), for the layer norms and the block's final norm
  (:func:`get_portable_gpt_block_spec`).
* ``tensor_parallel.model_parallel_cuda_manual_seed`` seeds CUDA generators: on CPU we seed with
  :func:`verl_bridge.distributed.seed_everything`, which only touches CUDA when it exists.
* megatron's ``DistributedDataParallel`` and distributed optimizer use CUDA streams / buffers; on
  CPU the runtime uses megatron's plain ``FP32Optimizer`` path and all-reduces DP gradients itself.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide


class SDPAttention(MegatronModule):
    """Core attention on ``scaled_dot_product_attention``; drop-in for megatron's DotProductAttention.

    Inputs follow megatron's layout: query ``[sq, b, np, hn]``, key/value ``[sk, b, ng, hn]``
    (``ng`` = query groups per TP partition, GQA when ``ng < np``). Output ``[sq, b, np*hn]``.

    Masking: with ``attn_mask_type == causal`` and no explicit mask, SDPA's ``is_causal`` is used
    (this is what lets the flash kernel run). An explicit boolean ``attention_mask`` follows
    megatron's convention (True = masked out) and is inverted for SDPA. Left padding in the
    rollout is expressed through an explicit mask built by the caller.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        cp_comm_type: Optional[str] = None,
        pg_collection=None,
        **kwargs,
    ):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError(
                f"SDPAttention does not support context parallelism "
                f"(context_parallel_size={config.context_parallel_size}); use 1"
            )
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        if pg_collection is not None and hasattr(pg_collection, "tp"):
            tp_size = pg_collection.tp.size()
        else:
            from megatron.core import parallel_state

            tp_size = parallel_state.get_tensor_model_parallel_world_size()
        head_dim = config.kv_channels
        self.num_heads = divide(config.num_attention_heads, tp_size)
        self.num_groups = divide(config.num_query_groups or config.num_attention_heads, tp_size)
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
        if config.apply_query_key_layer_scaling:
            # megatron scales scores by 1/layer_number and multiplies back in fp32 softmax; the
            # net effect on the softmax is none, so plain SDPA is already equivalent.
            pass
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        attn_mask_type: Optional[AttnMaskType] = None,
        attention_bias: Optional[torch.Tensor] = None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        if packed_seq_params is not None:
            raise ValueError("SDPAttention does not support packed sequences (packed_seq_params)")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        # [s, b, h, d] -> [b, h, s, d]
        q = query.permute(1, 2, 0, 3)
        k = key.permute(1, 2, 0, 3)
        v = value.permute(1, 2, 0, 3)
        if self.num_groups != self.num_heads:
            rep = self.num_heads // self.num_groups
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        sq, sk = q.shape[2], k.shape[2]
        mask = None
        is_causal = False
        if attention_mask is not None:
            # megatron: True means "masked out"; SDPA bool mask: True means "attend".
            mask = ~attention_mask.to(torch.bool) if attention_mask.dtype == torch.bool else attention_mask
        elif mask_type == AttnMaskType.causal:
            if sq == sk:
                is_causal = True
            else:  # decoding with a KV cache: queries are the last sq positions
                mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout_p if self.training else 0.0,
            is_causal=is_causal,
            scale=self.softmax_scale,
        )
        # [b, h, s, d] -> [s, b, h*d]
        b, h, s, d = out.shape
        return out.permute(2, 0, 1, 3).reshape(s, b, h * d)


class PortableNorm:
    """torch ``LayerNorm`` / ``RMSNorm`` (``config.normalization``) that can run sequence-parallel.

    The constructor contract of megatron's ``WrappedTorchNorm`` (and ``TENorm``): ``(config,
    hidden_size, eps)``. Under sequence parallelism each TP rank normalises its own slice of the
    sequence (megatron's scatter/gather around the layers does the splitting), so the weights get
    only that slice's gradient: they are tagged ``sequence_parallel = True`` as megatron tags its
    SP norms (TENorm, FusedLayerNorm), and ``finalize_model_grads`` (megatron's, or
    :func:`verl_bridge.runtime.grads.finalize_grads`) sums their gradients over TP.
    """

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_unused):
        if config.normalization == "LayerNorm":
            norm = torch.nn.LayerNorm(hidden_size, eps=eps)
        elif config.normalization == "RMSNorm":
            norm = torch.nn.RMSNorm(hidden_size, eps=eps)
        else:
            raise ValueError(f"PortableNorm: normalization={config.normalization!r}; LayerNorm or RMSNorm")
        if config.layernorm_zero_centered_gamma:
            raise ValueError("PortableNorm: layernorm_zero_centered_gamma is not supported; set it False")
        # weights in the default dtype, as WrappedTorchNorm (and apex's FusedLayerNorm) create them:
        # Megatron-LM's get_model() (Float16Module) casts the whole model afterwards
        for p in norm.parameters():
            setattr(p, "sequence_parallel", bool(config.sequence_parallel))
        return norm


def get_portable_gpt_layer_spec(normalization: str = "LayerNorm", qk_layernorm: bool = False,
                                num_experts: Optional[int] = None) -> ModuleSpec:
    """megatron-core's local GPT layer spec with :class:`SDPAttention` as core attention and
    :class:`PortableNorm` as the layer norms (sequence-parallel capable).

    ``num_experts``: a Mixture-of-Experts layer, megatron's own ``MoELayer`` (``TopKRouter``, the
    token dispatcher the config names, ``SequentialMLP`` experts: grouped GEMM needs Transformer
    Engine; shared experts when the config sets ``moe_shared_expert_intermediate_size``). Its
    router runs on the CPU through :func:`verl_bridge.compat.moe.make_router_cpu_safe` (applied by
    :func:`verl_bridge.compat.make_cpu_safe`)."""
    if num_experts is not None and (not isinstance(num_experts, int) or num_experts < 1):
        raise ValueError(f"get_portable_gpt_layer_spec: num_experts={num_experts!r}; a positive integer or None")
    spec = get_gpt_layer_local_spec(num_experts=num_experts, moe_grouped_gemm=False,
                                    normalization=normalization, qk_layernorm=qk_layernorm)
    spec.submodules.self_attention.submodules.core_attention = SDPAttention
    for key in ("input_layernorm", "pre_mlp_layernorm"):
        if _is_torch_norm(getattr(spec.submodules, key)):  # not apex's FusedLayerNorm where installed
            setattr(spec.submodules, key, PortableNorm)
    return spec


def _is_torch_norm(cls) -> bool:
    """megatron's ``WrappedTorchNorm`` (the local spec's norm without apex), which refuses SP."""
    return getattr(cls, "__name__", "") == "WrappedTorchNorm"


def block_spec_for_layer(config: TransformerConfig, layer_spec, vp_stage=None):
    """``layer_spec`` as a block spec with a :class:`PortableNorm` final norm when ``config`` runs
    sequence-parallel and megatron's default final norm would be its torch norm (which refuses SP);
    otherwise ``layer_spec`` unchanged."""
    from megatron.core.transformer.transformer_block import LayerNormImpl, get_num_layers_to_build

    from verl_bridge.compat.mcore_versions import VP_STAGE_SINCE, mcore_version

    if not getattr(config, "sequence_parallel", False) or not isinstance(layer_spec, ModuleSpec):
        return layer_spec
    if not _is_torch_norm(LayerNormImpl):
        return layer_spec
    kw = {"vp_stage": vp_stage} if mcore_version() >= VP_STAGE_SINCE else {}
    return TransformerBlockSubmodules(layer_specs=[layer_spec] * get_num_layers_to_build(config, **kw),
                                      layer_norm=PortableNorm)


def get_portable_gpt_block_spec(config: TransformerConfig, normalization: str = "LayerNorm",
                                qk_layernorm: bool = False, vp_stage=None) -> TransformerBlockSubmodules:
    # an MoE config (num_moe_experts) gets MoE layers: every layer is an MoE layer
    """The block spec of this pipeline stage (``vp_stage``: its virtual chunk): the portable layer spec
    for each of its layers and :class:`PortableNorm` as the final norm (a bare layer spec gets
    megatron's default final norm, which refuses sequence parallelism without TE or apex)."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    from verl_bridge.compat.mcore_versions import VP_STAGE_SINCE, mcore_version

    from megatron.core.transformer.transformer_block import LayerNormImpl

    layer = get_portable_gpt_layer_spec(normalization, qk_layernorm,
                                        num_experts=getattr(config, "num_moe_experts", None))
    kw = {"vp_stage": vp_stage} if mcore_version() >= VP_STAGE_SINCE else {}
    n = get_num_layers_to_build(config, **kw)
    final = PortableNorm if _is_torch_norm(LayerNormImpl) else LayerNormImpl
    return TransformerBlockSubmodules(layer_specs=[layer] * n, layer_norm=final)
