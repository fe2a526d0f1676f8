"""OPT (``OPTForCausalLM``): LayerNorm with biases, ReLU MLP, learned absolute positions.

HF's position table has 2 extra leading rows (``OPTLearnedPositionalEmbedding.offset = 2``):
megatron position ``p`` is HF row ``p + 2``. Import drops the 2 rows (kept aside as "extras"
so that an export reproduces the HF tensor bit for bit). Only the common OPT shape is
supported: ``do_layer_norm_before=True`` and ``word_embed_proj_dim == hidden_size``
(not opt-350m).
"""

from __future__ import annotations

import torch.nn.functional as F

from verl_bridge.arch.spec import ArchSpec

L = "model.decoder.layers.{}."
M = "decoder.layers.{}."

FROM_HF = {
    "model.decoder.embed_tokens.weight": "embedding.word_embeddings.weight",
    "model.decoder.embed_positions.weight": "embedding.position_embeddings.weight",
    L + "self_attn_layer_norm.weight": M + "input_layernorm.weight",
    L + "self_attn_layer_norm.bias": M + "input_layernorm.bias",
    L + "self_attn.q_proj.weight": (M + "self_attention.linear_qkv.weight", "q"),
    L + "self_attn.k_proj.weight": (M + "self_attention.linear_qkv.weight", "k"),
    L + "self_attn.v_proj.weight": (M + "self_attention.linear_qkv.weight", "v"),
    L + "self_attn.q_proj.bias": (M + "self_attention.linear_qkv.bias", "q"),
    L + "self_attn.k_proj.bias": (M + "self_attention.linear_qkv.bias", "k"),
    L + "self_attn.v_proj.bias": (M + "self_attention.linear_qkv.bias", "v"),
    L + "self_attn.out_proj.weight": M + "self_attention.linear_proj.weight",
    L + "self_attn.out_proj.bias": M + "self_attention.linear_proj.bias",
    L + "final_layer_norm.weight": M + "pre_mlp_layernorm.weight",
    L + "final_layer_norm.bias": M + "pre_mlp_layernorm.bias",
    L + "fc1.weight": M + "mlp.linear_fc1.weight",
    L + "fc1.bias": M + "mlp.linear_fc1.bias",
    L + "fc2.weight": M + "mlp.linear_fc2.weight",
    L + "fc2.bias": M + "mlp.linear_fc2.bias",
    "model.decoder.final_layer_norm.weight": "decoder.final_layernorm.weight",
    "model.decoder.final_layer_norm.bias": "decoder.final_layernorm.bias",
    "lm_head.weight": "output_layer.weight",
}


def _mcore_config(hf):
    if not getattr(hf, "do_layer_norm_before", True):
        raise ValueError("OPT with do_layer_norm_before=False (opt-350m) is not supported")
    if getattr(hf, "word_embed_proj_dim", hf.hidden_size) != hf.hidden_size:
        raise ValueError("OPT with word_embed_proj_dim != hidden_size (project_in/out) is not supported")
    if getattr(hf, "activation_function", "relu") != "relu":
        raise ValueError(f"OPT activation_function={hf.activation_function!r} is not supported")
    if not getattr(hf, "enable_bias", True) or not getattr(hf, "layer_norm_elementwise_affine", True):
        raise ValueError("OPT without biases / affine layer norms is not supported")
    heads = hf.num_attention_heads
    tf = dict(
        num_layers=hf.num_hidden_layers,
        hidden_size=hf.hidden_size,
        num_attention_heads=heads,
        num_query_groups=heads,
        kv_channels=hf.hidden_size // heads,
        ffn_hidden_size=hf.ffn_dim,
        normalization="LayerNorm",
        layernorm_epsilon=1e-5,  # OPT uses nn.LayerNorm's default
        gated_linear_unit=False,
        activation_func=F.relu,
        add_bias_linear=True,
        add_qkv_bias=True,
    )
    gpt = dict(
        position_embedding_type="learned_absolute",
        rotary_base=10000,
        max_sequence_length=hf.max_position_embeddings,
        share_embeddings_and_output_weights=bool(getattr(hf, "tie_word_embeddings", True)),
    )
    return tf, gpt


def _hf_config(d: dict) -> dict:
    return {
        "architectures": ["OPTForCausalLM"],
        "model_type": "opt",
        "vocab_size": d["vocab_size"],
        "hidden_size": d["hidden_size"],
        "word_embed_proj_dim": d["hidden_size"],
        "ffn_dim": d["ffn_hidden_size"],
        "num_hidden_layers": d["num_layers"],
        "num_attention_heads": d["num_attention_heads"],
        "max_position_embeddings": d["max_position_embeddings"],
        "do_layer_norm_before": True,
        "activation_function": "relu",
        "enable_bias": True,
        "layer_norm_elementwise_affine": True,
        "tie_word_embeddings": d["tie_embeddings"],
        "torch_dtype": d.get("torch_dtype", "float32"),
    }


OPT = ArchSpec(
    name="opt",
    hf_architectures=("OPTForCausalLM",),
    hf_model_type="opt",
    from_hf=FROM_HF,
    features=dict(normalization="LayerNorm", gated_linear_unit=False, add_qkv_bias=True,
                  add_bias_linear=True, position_embedding_type="learned_absolute"),
    position_offset=2,
    mcore_config=_mcore_config,
    hf_config=_hf_config,
)
