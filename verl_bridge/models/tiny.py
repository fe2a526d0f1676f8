"""The built-in ``tiny`` preset: a Llama-style megatron-core GPTModel for the CPU quickstart.

RMSNorm, SwiGLU, RoPE, no biases, untied output layer; shape from ``model.actor.args``
(``num_layers``, ``hidden_size``, ``num_attention_heads``, ``num_query_groups``).

The ``tiny-moe`` preset is the same model with a Mixture-of-Experts MLP in every layer (megatron's
own ``MoELayer`` on the portable spec): ``num_experts`` (default 4), ``moe_router_topk`` (2),
``moe_ffn_hidden_size`` (each expert's hidden size, default ``ffn_hidden_size`` or 2 x hidden),
``moe_shared_expert_intermediate_size`` (None: no shared expert), ``moe_aux_loss_coeff`` (the
load-balancing loss coefficient, 0.01); the allgather token dispatcher, experts split over
``trainer.args.ep_size`` ranks.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


def precision_kwargs(precision: str = "fp32") -> dict:
    """TransformerConfig flags for ``trainer.precision`` (fp32 | bf16 | fp16)."""
    if precision == "bf16":
        return dict(bf16=True, params_dtype=torch.bfloat16)
    if precision == "fp16":
        return dict(fp16=True, params_dtype=torch.float16)
    return {}


def transformer_config_kwargs(precision: str = "fp32") -> dict:
    """Flags every verl-bridge model sets so that megatron-core's local modules run on CPU too."""
    from verl_bridge.arch.hf import PORTABLE_FLAGS

    return dict(PORTABLE_FLAGS, use_cpu_initialization=not torch.cuda.is_available(),
                **precision_kwargs(precision))


MOE_PRESETS = ("tiny-moe",)


def moe_config_kwargs(args, ep_size: int = 1, routing_replay: bool = False) -> dict:
    """TransformerConfig MoE flags of the ``tiny-moe`` preset from ``model.actor.args`` (empty for
    a dense preset)."""
    if getattr(args, "preset", None) not in MOE_PRESETS:
        return {}
    ffn = args.moe_ffn_hidden_size or args.ffn_hidden_size or 2 * args.hidden_size
    return dict(
        num_moe_experts=args.num_experts or 4,
        moe_router_topk=args.moe_router_topk or 2,
        moe_ffn_hidden_size=ffn,
        moe_shared_expert_intermediate_size=args.moe_shared_expert_intermediate_size,
        moe_aux_loss_coeff=float(args.moe_aux_loss_coeff if args.moe_aux_loss_coeff is not None else 0.01),
        moe_router_load_balancing_type="aux_loss",
        moe_token_dispatcher_type="allgather",
        moe_grouped_gemm=False,
        expert_model_parallel_size=ep_size,
        **({"moe_enable_routing_replay": True} if routing_replay else {}),
    )


def tiny_model_provider(args, vocab_size: int, max_sequence_length: int, precision: str = "fp32",
                        tp_size: int = 1, sequence_parallel: bool = False, pp_size: int | None = None,
                        vp_size: int | None = None, ep_size: int = 1, routing_replay: bool = False) -> Callable:
    """``model_provider(pre_process, post_process, vp_stage=None)``; ``pp_size`` default: megatron's
    current pipeline size; ``vp_size``: virtual pipeline chunks per stage (None: no virtual pipeline)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from verl_bridge.compat import make_cpu_safe
    from verl_bridge.compat.mcore_versions import gpt_model_kwargs
    from verl_bridge.distributed.state import model_parallel_state
    from verl_bridge.models.spec import get_portable_gpt_block_spec

    def model_provider(pre_process: bool = True, post_process: bool = True, vp_stage=None) -> GPTModel:
        ps = model_parallel_state()
        pp = pp_size if pp_size is not None else (ps.pp_size if ps is not None else 1)
        config = TransformerConfig(
            num_layers=args.num_layers,
            hidden_size=args.hidden_size,
            num_attention_heads=args.num_attention_heads,
            num_query_groups=args.num_query_groups,
            ffn_hidden_size=args.ffn_hidden_size or 4 * args.hidden_size,
            normalization="RMSNorm",
            gated_linear_unit=True,
            activation_func=F.silu,
            add_bias_linear=False,
            init_method_std=0.02,
            tensor_model_parallel_size=tp_size,
            pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vp_size,
            sequence_parallel=sequence_parallel and tp_size > 1,
            pipeline_dtype=precision_kwargs(precision).get("params_dtype", torch.float32),
            **moe_config_kwargs(args, ep_size, routing_replay),
            **transformer_config_kwargs(precision),
        )
        model = GPTModel(
            config=config,
            transformer_layer_spec=get_portable_gpt_block_spec(config, "RMSNorm", vp_stage=vp_stage),
            vocab_size=vocab_size,
            max_sequence_length=max_sequence_length,
            pre_process=pre_process,
            post_process=post_process,
            position_embedding_type="rope",
            share_embeddings_and_output_weights=bool(getattr(args, "tie_embeddings", False)),
            **gpt_model_kwargs(vp_stage),
        )
        model.hf_vocab_size = vocab_size  # built unpadded: the samplers' and the trainer's vocabulary
        return make_cpu_safe(model)

    return model_provider
