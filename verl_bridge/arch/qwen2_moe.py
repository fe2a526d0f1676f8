"""Qwen2-MoE (``Qwen2MoeForCausalLM``, e.g. Qwen1.5-MoE-A2.7B): the Qwen2 layout (q/k/v biases) with
routed experts plus one shared expert behind a sigmoid gate in every layer.

Routed experts ``mlp.experts.{e}.{gate,up,down}_proj`` (``moe_intermediate_size``), router
``mlp.gate``; the shared expert ``mlp.shared_expert.*`` (``shared_expert_intermediate_size``) is
megatron's ``shared_experts`` with ``moe_shared_expert_gate`` (``shared_expert_gate`` ->
``gate_weight``). ``norm_topk_prob`` picks the router's renormalisation (see :mod:`.moe`).
"""

from __future__ import annotations

from verl_bridge.arch.llama import L, M, llama_family_config, llama_family_hf_config
from verl_bridge.arch.moe import check_hf_moe, moe_features, moe_hf_fields, moe_tf_kwargs
from verl_bridge.arch.qwen2 import FROM_HF as QWEN2_FROM_HF
from verl_bridge.arch.spec import ArchSpec

E = L + "mlp.experts.{e}."
ME = M + "mlp.experts.local_experts.{e}."
S, MS = L + "mlp.shared_expert.", M + "mlp.shared_experts."

ROUTED = {
    L + "mlp.gate.weight": M + "mlp.router.weight",
    E + "gate_proj.weight": (ME + "linear_fc1.weight", "gate"),
    E + "up_proj.weight": (ME + "linear_fc1.weight", "up"),
    E + "down_proj.weight": ME + "linear_fc2.weight",
}

FROM_HF = {
    **{k: v for k, v in QWEN2_FROM_HF.items() if ".mlp." not in k},
    **ROUTED,
    S + "gate_proj.weight": (MS + "linear_fc1.weight", "gate"),
    S + "up_proj.weight": (MS + "linear_fc1.weight", "up"),
    S + "down_proj.weight": MS + "linear_fc2.weight",
    L + "mlp.shared_expert_gate.weight": MS + "gate_weight",
}


def _mcore_config(hf):
    check_hf_moe(hf)
    if getattr(hf, "use_sliding_window", False):
        raise ValueError("Qwen2-MoE use_sliding_window=True is not supported by the megatron conversion")
    tf, gpt = llama_family_config(hf, add_qkv_bias=True)
    shared = getattr(hf, "shared_expert_intermediate_size", None)
    if not shared:
        raise ValueError("Qwen2-MoE without a shared expert (shared_expert_intermediate_size=0) is not in the map; "
                         "use Qwen3-MoE's layout")
    tf.update(moe_tf_kwargs(hf, ffn=hf.moe_intermediate_size, shared=int(shared),
                            renormalize=bool(getattr(hf, "norm_topk_prob", False))))
    return tf, gpt


def _hf_config(d: dict) -> dict:
    return {**llama_family_hf_config(d, arch="Qwen2MoeForCausalLM", model_type="qwen2_moe"), **moe_hf_fields(d),
            "moe_intermediate_size": d["moe_ffn_hidden_size"], "num_experts": d["num_experts"],
            "shared_expert_intermediate_size": d["shared_expert_ffn_hidden_size"],
            "norm_topk_prob": not d["moe_router_pre_softmax"], "decoder_sparse_step": 1, "mlp_only_layers": [],
            "use_sliding_window": False, "qkv_bias": True}


QWEN2_MOE = ArchSpec(
    name="qwen2_moe",
    hf_architectures=("Qwen2MoeForCausalLM",),
    hf_model_type="qwen2_moe",
    from_hf=FROM_HF,
    features=moe_features(shared=True, gate=True, qk_layernorm=False, qkv_bias=True),
    mcore_config=_mcore_config,
    hf_config=_hf_config,
)
