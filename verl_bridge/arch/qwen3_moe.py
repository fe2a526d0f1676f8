"""Qwen3-MoE (``Qwen3MoeForCausalLM``, e.g. Qwen3-30B-A3B): Llama-style attention without biases
plus per-head RMSNorm on queries and keys (``q_norm``/``k_norm`` -> megatron ``q_layernorm`` /
``k_layernorm``), routed experts in every layer, no shared expert.
"""

from __future__ import annotations

from verl_bridge.arch.llama import FROM_HF as LLAMA_FROM_HF, L, M, llama_family_config, llama_family_hf_config
from verl_bridge.arch.moe import check_hf_moe, moe_features, moe_hf_fields, moe_tf_kwargs
from verl_bridge.arch.qwen2_moe import ROUTED
from verl_bridge.arch.spec import ArchSpec

FROM_HF = {
    **{k: v for k, v in LLAMA_FROM_HF.items() if ".mlp." not in k},
    L + "self_attn.q_norm.weight": M + "self_attention.q_layernorm.weight",
    L + "self_attn.k_norm.weight": M + "self_attention.k_layernorm.weight",
    **ROUTED,
}


def _mcore_config(hf):
    check_hf_moe(hf)
    if getattr(hf, "use_sliding_window", False):
        raise ValueError("Qwen3-MoE use_sliding_window=True is not supported by the megatron conversion")
    tf, gpt = llama_family_config(hf, add_qkv_bias=False)
    tf.update(moe_tf_kwargs(hf, ffn=hf.moe_intermediate_size, renormalize=bool(getattr(hf, "norm_topk_prob", False))),
              qk_layernorm=True)
    return tf, gpt


def _hf_config(d: dict) -> dict:
    return {**llama_family_hf_config(d, arch="Qwen3MoeForCausalLM", model_type="qwen3_moe"), **moe_hf_fields(d),
            "moe_intermediate_size": d["moe_ffn_hidden_size"], "num_experts": d["num_experts"],
            "norm_topk_prob": not d["moe_router_pre_softmax"], "decoder_sparse_step": 1, "mlp_only_layers": [],
            "use_sliding_window": False, "attention_bias": False}


QWEN3_MOE = ArchSpec(
    name="qwen3_moe",
    hf_architectures=("Qwen3MoeForCausalLM",),
    hf_model_type="qwen3_moe",
    from_hf=FROM_HF,
    features=moe_features(shared=False, gate=False, qk_layernorm=True, qkv_bias=False),
    mcore_config=_mcore_config,
    hf_config=_hf_config,
)
