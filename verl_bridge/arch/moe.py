"""What the Mixture-of-Experts maps share: megatron MoE config from an HF config, HF config fields
back, and what no map here covers (named, never converted wrongly).

The maps (``mixtral``, ``qwen2_moe``, ``qwen3_moe``) are for megatron-core's ``MoELayer`` with
``SequentialMLP`` experts (the portable / local spec; grouped GEMM needs Transformer Engine):

=======================================================  =============================================
megatron-core (``{}`` layer, ``{e}`` global expert)        Hugging Face checkpoint
=======================================================  =============================================
``mlp.router.weight`` ``[E, H]``                          ``block_sparse_moe.gate.weight`` / ``mlp.gate.weight``
``mlp.experts.local_experts.{e}.linear_fc1.weight``      ``[gate; up]`` of ``w1``/``w3`` (Mixtral) or
                                                          ``gate_proj``/``up_proj`` (Qwen)
``mlp.experts.local_experts.{e}.linear_fc2.weight``      ``w2`` / ``down_proj``
``mlp.shared_experts.linear_fc1/fc2.weight``             ``mlp.shared_expert.{gate,up,down}_proj`` (Qwen2-MoE)
``mlp.shared_experts.gate_weight`` ``[1, H]``             ``mlp.shared_expert_gate.weight`` (sigmoid gate)
=======================================================  =============================================

Expert parallelism: expert ``e`` lives on EP rank ``e // (E/ep)`` as its local expert ``e % (E/ep)``
(:func:`verl_bridge.arch.convert.expert_owner`); the maps use global indices.

Routing: HF's top-k softmax router with renormalised top-k weights (Mixtral, Qwen ``norm_topk_prob:
true``) is megatron's ``moe_router_pre_softmax=False`` (top-k of the logits, softmax over the k);
without renormalisation (Qwen ``norm_topk_prob: false``) it is ``moe_router_pre_softmax=True``
(softmax over all experts, then top-k).
"""

from __future__ import annotations

from typing import Optional

# HF architectures whose MoE layers the maps here do not cover, and why
UNSUPPORTED_HF = {
    "DeepseekV3ForCausalLM": "DeepSeek-V3: multi-latent attention (MLA), sigmoid router scores with a per-expert "
                             "bias (e_score_correction_bias), grouped top-k (n_group/topk_group), "
                             "routed_scaling_factor and dense first layers (first_k_dense_replace)",
    "DeepseekV2ForCausalLM": "DeepSeek-V2: multi-latent attention (MLA), grouped top-k routing and dense first layers",
    "Glm4MoeForCausalLM": "GLM-4.5: sigmoid router scores with a per-expert bias, routed_scaling_factor and dense "
                          "first layers",
    "GptOssForCausalLM": "gpt-oss: biased experts with a clamped SwiGLU, attention sinks and sliding windows",
    "Qwen3NextForCausalLM": "Qwen3-Next: linear-attention (Gated DeltaNet) layers",
    "Llama4ForConditionalGeneration": "Llama 4: interleaved dense / MoE layers and chunked attention",
    "Llama4ForCausalLM": "Llama 4: interleaved dense / MoE layers and chunked attention",
}

MOE_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")


def unsupported_hf_reason(names) -> Optional[str]:
    for n in names:
        if n in UNSUPPORTED_HF:
            return (f"{n} is a Mixture-of-Experts model the conversion maps do not cover ({UNSUPPORTED_HF[n]}); "
                    f"the MoE maps cover {', '.join(MOE_ARCHS)}. Register an architecture for it with "
                    "verl_bridge.arch.register_architecture.")
    return None


def unsupported_mcore_features(config) -> list[str]:
    """What a megatron MoE config (TransformerConfig or Megatron-LM args) uses that no MoE map covers."""
    out = []
    g = lambda k, d=None: getattr(config, k, d)  # noqa: E731
    if g("multi_latent_attention"):
        out.append("multi-latent attention (multi_latent_attention=True, DeepSeek-V3 MLA)")
    if g("moe_router_group_topk") or g("moe_router_num_groups"):
        out.append(f"grouped top-k routing (moe_router_num_groups={g('moe_router_num_groups')}, "
                   f"moe_router_group_topk={g('moe_router_group_topk')})")
    if g("moe_router_score_function", "softmax") != "softmax":
        out.append(f"moe_router_score_function={g('moe_router_score_function')!r} (the maps' HF routers use softmax)")
    if g("moe_router_enable_expert_bias"):
        out.append("a router expert bias (moe_router_enable_expert_bias=True, HF e_score_correction_bias)")
    if g("moe_router_topk_scaling_factor"):
        out.append(f"moe_router_topk_scaling_factor={g('moe_router_topk_scaling_factor')} (routed_scaling_factor)")
    freq = g("moe_layer_freq", 1)
    if freq not in (1, None) and not (isinstance(freq, (list, tuple)) and all(x == 1 for x in freq)):
        out.append(f"dense layers between MoE layers (moe_layer_freq={freq})")
    if g("moe_grouped_gemm"):
        out.append("grouped-GEMM experts (moe_grouped_gemm=True, TEGroupedMLP names experts.linear_fc1.weight<i>; "
                   "the maps cover SequentialMLP local_experts)")
    if g("moe_shared_expert_intermediate_size") is not None and not g("moe_shared_expert_gate", False):
        out.append("shared experts without a sigmoid gate (moe_shared_expert_gate=False; Qwen2-MoE gates its shared "
                   "expert, DeepSeek-style ungated shared experts have no HF class in the maps)")
    if g("moe_router_pre_softmax") and g("moe_router_score_function", "softmax") == "softmax" \
            and g("moe_shared_expert_intermediate_size") is None and not g("qk_layernorm", False):
        out.append("top-k weights without renormalisation (moe_router_pre_softmax=True) on a Mixtral-like layout "
                   "(Mixtral renormalises its top-k weights)")
    return out


def check_hf_moe(hf, sparse_key: str = "decoder_sparse_step") -> None:
    """Refuse HF MoE configs with dense layers in between (the maps give every layer experts)."""
    step = getattr(hf, sparse_key, 1)
    only = list(getattr(hf, "mlp_only_layers", None) or [])
    if (step not in (None, 1)) or only:
        raise ValueError(f"{type(hf).__name__}: decoder_sparse_step={step}, mlp_only_layers={only}: dense MLP layers "
                         "between MoE layers are not supported by the megatron conversion (every layer must be MoE)")
    if getattr(hf, "router_jitter_noise", 0.0):
        raise ValueError(f"router_jitter_noise={hf.router_jitter_noise} has no megatron-core equivalent; set it to 0")


def num_experts_of(hf) -> int:
    for key in ("num_local_experts", "num_experts"):
        v = getattr(hf, key, None)
        if v:
            return int(v)
    raise ValueError(f"{type(hf).__name__} names no number of experts (num_local_experts / num_experts)")


def moe_tf_kwargs(hf, *, ffn: int, shared: Optional[int] = None, renormalize: bool = True) -> dict:
    """TransformerConfig MoE kwargs: SequentialMLP experts, allgather dispatcher, softmax top-k router."""
    topk = int(hf.num_experts_per_tok)
    return dict(
        num_moe_experts=num_experts_of(hf),
        moe_router_topk=topk,
        moe_ffn_hidden_size=int(ffn),
        moe_router_pre_softmax=not renormalize,
        moe_router_score_function="softmax",
        moe_shared_expert_intermediate_size=shared,
        # a config field from megatron-core 0.16 on (checked: absent in 0.13.1, a layer-spec param there)
        **({"moe_shared_expert_gate": True} if shared is not None else {}),
        moe_aux_loss_coeff=float(getattr(hf, "router_aux_loss_coef", 0.0) or 0.0),
        moe_router_load_balancing_type="aux_loss",
        moe_token_dispatcher_type="allgather",
        moe_grouped_gemm=False,
    )


def moe_hf_fields(d: dict) -> dict:
    """HF config fields common to the MoE architectures from a description dict."""
    return {"num_experts_per_tok": d["moe_router_topk"],
            "router_aux_loss_coef": d.get("moe_aux_loss_coeff", 0.0),
            "output_router_logits": False}


def moe_features(shared: bool, gate: bool, qk_layernorm: bool, qkv_bias: bool) -> dict:
    return dict(normalization="RMSNorm", gated_linear_unit=True, add_qkv_bias=qkv_bias, add_bias_linear=False,
                position_embedding_type="rope", moe=True, moe_shared_expert=shared, moe_shared_expert_gate=gate,
                qk_layernorm=qk_layernorm)
