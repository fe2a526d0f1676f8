"""Mixtral (``MixtralForCausalLM``): the Llama/Mistral layout with a top-k softmax MoE in every layer.

Experts are SwiGLU MLPs ``w1`` (gate), ``w3`` (up), ``w2`` (down), fused as megatron's
``local_experts.{e}.linear_fc1 = [w1; w3]``; the router ``block_sparse_moe.gate``; the top-k
weights are renormalised (megatron ``moe_router_pre_softmax=False``). No shared expert.
"""

from __future__ import annotations

from verl_bridge.arch.llama import FROM_HF as LLAMA_FROM_HF, L, M, llama_family_config, llama_family_hf_config
from verl_bridge.arch.moe import check_hf_moe, moe_features, moe_hf_fields, moe_tf_kwargs
from verl_bridge.arch.spec import ArchSpec

E = L + "block_sparse_moe.experts.{e}."
ME = M + "mlp.experts.local_experts.{e}."

FROM_HF = {
    **{k: v for k, v in LLAMA_FROM_HF.items() if ".mlp." not in k},
    L + "block_sparse_moe.gate.weight": M + "mlp.router.weight",
    E + "w1.weight": (ME + "linear_fc1.weight", "gate"),
    E + "w3.weight": (ME + "linear_fc1.weight", "up"),
    E + "w2.weight": ME + "linear_fc2.weight",
}


def _mcore_config(hf):
    check_hf_moe(hf)
    tf, gpt = llama_family_config(hf, add_qkv_bias=False)
    tf.update(moe_tf_kwargs(hf, ffn=hf.intermediate_size, renormalize=True))
    return tf, gpt


def _hf_config(d: dict) -> dict:
    return {**llama_family_hf_config(d, arch="MixtralForCausalLM", model_type="mixtral"), **moe_hf_fields(d),
            "intermediate_size": d["moe_ffn_hidden_size"], "num_local_experts": d["num_experts"],
            "router_jitter_noise": 0.0, "sliding_window": None}


MIXTRAL = ArchSpec(
    name="mixtral",
    hf_architectures=("MixtralForCausalLM",),
    hf_model_type="mixtral",
    from_hf=FROM_HF,
    features=dict(moe_features(shared=False, gate=False, qk_layernorm=False, qkv_bias=False),
                  moe_router_pre_softmax=False),
    mcore_config=_mcore_config,
    hf_config=_hf_config,
)
