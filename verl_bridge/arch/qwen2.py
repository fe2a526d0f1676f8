"""Qwen2 (``Qwen2ForCausalLM``): the Llama layout plus q/k/v biases; often GQA and tied embeddings."""

from __future__ import annotations

from verl_bridge.arch.llama import FROM_HF as LLAMA_FROM_HF, L, M, llama_family_config, llama_family_hf_config
from verl_bridge.arch.spec import ArchSpec

FROM_HF = {
    **LLAMA_FROM_HF,
    L + "self_attn.q_proj.bias": (M + "self_attention.linear_qkv.bias", "q"),
    L + "self_attn.k_proj.bias": (M + "self_attention.linear_qkv.bias", "k"),
    L + "self_attn.v_proj.bias": (M + "self_attention.linear_qkv.bias", "v"),
}


def _mcore_config(hf):
    if getattr(hf, "use_sliding_window", False):
        raise ValueError("Qwen2 use_sliding_window=True is not supported by the megatron conversion")
    return llama_family_config(hf, add_qkv_bias=True)


QWEN2 = ArchSpec(
    name="qwen2",
    hf_architectures=("Qwen2ForCausalLM",),
    hf_model_type="qwen2",
    from_hf=FROM_HF,
    features=dict(normalization="RMSNorm", gated_linear_unit=True, add_qkv_bias=True,
                  add_bias_linear=False, position_embedding_type="rope"),
    mcore_config=_mcore_config,
    hf_config=lambda d: {**llama_family_hf_config(d, arch="Qwen2ForCausalLM", model_type="qwen2"),
                         "use_sliding_window": False},
)
