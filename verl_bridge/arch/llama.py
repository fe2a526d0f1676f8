"""Llama (``LlamaForCausalLM``): RMSNorm, SwiGLU (gate/up fused in ``linear_fc1``), RoPE, GQA, no biases."""

from __future__ import annotations

import torch.nn.functional as F

from verl_bridge.arch.spec import ArchSpec

L = "model.layers.{}."
M = "decoder.layers.{}."

FROM_HF = {
    "model.embed_tokens.weight": "embedding.word_embeddings.weight",
    L + "input_layernorm.weight": M + "input_layernorm.weight",
    L + "self_attn.q_proj.weight": (M + "self_attention.linear_qkv.weight", "q"),
    L + "self_attn.k_proj.weight": (M + "self_attention.linear_qkv.weight", "k"),
    L + "self_attn.v_proj.weight": (M + "self_attention.linear_qkv.weight", "v"),
    L + "self_attn.o_proj.weight": M + "self_attention.linear_proj.weight",
    L + "post_attention_layernorm.weight": M + "pre_mlp_layernorm.weight",
    L + "mlp.gate_proj.weight": (M + "mlp.linear_fc1.weight", "gate"),
    L + "mlp.up_proj.weight": (M + "mlp.linear_fc1.weight", "up"),
    L + "mlp.down_proj.weight": M + "mlp.linear_fc2.weight",
    L + "self_attn.rotary_emb.inv_freq": None,  # old checkpoints saved the RoPE buffer
    "model.norm.weight": "decoder.final_layernorm.weight",
    "lm_head.weight": "output_layer.weight",
}


def rope_theta(hf) -> float:
    """RoPE base from an HF config (transformers 5: ``rope_parameters``; 4.x: ``rope_theta``)."""
    params = getattr(hf, "rope_parameters", None) or {}
    scaling = getattr(hf, "rope_scaling", None) or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise ValueError(f"RoPE scaling {rope_type!r} is not supported by the megatron conversion yet")
    theta = params.get("rope_theta", getattr(hf, "rope_theta", None))
    return float(theta if theta is not None else 10000.0)


def llama_family_config(hf, *, add_qkv_bias: bool) -> tuple[dict, dict]:
    if getattr(hf, "attention_bias", False) and not add_qkv_bias:
        raise ValueError("attention_bias=True (bias on o_proj too) has no megatron-core equivalent here")
    if getattr(hf, "mlp_bias", False):
        raise ValueError("mlp_bias=True is not supported by the megatron conversion")
    if getattr(hf, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={hf.hidden_act!r} is not supported (SwiGLU needs silu)")
    heads = hf.num_attention_heads
    tf = dict(
        num_layers=hf.num_hidden_layers,
        hidden_size=hf.hidden_size,
        num_attention_heads=heads,
        num_query_groups=getattr(hf, "num_key_value_heads", None) or heads,
        kv_channels=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
        ffn_hidden_size=hf.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=add_qkv_bias,
    )
    gpt = dict(
        position_embedding_type="rope",
        rotary_base=rope_theta(hf),
        max_sequence_length=hf.max_position_embeddings,
        share_embeddings_and_output_weights=bool(getattr(hf, "tie_word_embeddings", False)),
    )
    return tf, gpt


def llama_family_hf_config(d: dict, *, arch: str, model_type: str) -> dict:
    return {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": d["vocab_size"],
        "hidden_size": d["hidden_size"],
        "intermediate_size": d["ffn_hidden_size"],
        "num_hidden_layers": d["num_layers"],
        "num_attention_heads": d["num_attention_heads"],
        "num_key_value_heads": d["num_query_groups"],
        "head_dim": d["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": d["max_position_embeddings"],
        "rms_norm_eps": d["norm_eps"],
        "rope_theta": d["rotary_base"],
        "tie_word_embeddings": d["tie_embeddings"],
        "torch_dtype": d.get("torch_dtype", "float32"),
    }


LLAMA = ArchSpec(
    name="llama",
    hf_architectures=("LlamaForCausalLM",),
    hf_model_type="llama",
    from_hf=FROM_HF,
    features=dict(normalization="RMSNorm", gated_linear_unit=True, add_qkv_bias=False,
                  add_bias_linear=False, position_embedding_type="rope"),
    mcore_config=lambda hf: llama_family_config(hf, add_qkv_bias=False),
    hf_config=lambda d: {**llama_family_hf_config(d, arch="LlamaForCausalLM", model_type="llama"),
                         "attention_bias": False, "mlp_bias": False},
)
