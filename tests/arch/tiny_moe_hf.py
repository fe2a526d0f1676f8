"""Tiny random Hugging Face Mixture-of-Experts models saved locally (no downloads), fp32."""

from __future__ import annotations

import torch

COMMON = dict(vocab_size=100, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
              max_position_embeddings=64, rms_norm_eps=1e-6, num_experts_per_tok=2, tie_word_embeddings=False)

MOE_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")


def make_moe_config(arch: str):
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    if arch == "mixtral":  # top-2 of 4, renormalised
        return MixtralConfig(**COMMON, intermediate_size=48, num_local_experts=4, head_dim=8)
    if arch == "qwen2_moe":  # q/k/v biases, a gated shared expert, top-k not renormalised
        return Qwen2MoeConfig(**COMMON, intermediate_size=48, moe_intermediate_size=16, num_experts=4,
                              shared_expert_intermediate_size=24, norm_topk_prob=False)
    if arch == "qwen3_moe":  # q/k norms, renormalised top-k, no shared expert
        return Qwen3MoeConfig(**COMMON, intermediate_size=48, moe_intermediate_size=16, num_experts=4, head_dim=8,
                              norm_topk_prob=True)
    raise ValueError(arch)


def make_tiny_moe_hf(arch: str, out_dir, seed: int = 0):
    """Save a random tiny MoE model of *arch* to *out_dir*; return the in-memory HF model (fp32, eval).

    Norms are perturbed (a swapped norm would show) and the routers scaled up so that top-k choices
    are decisive (a float-rounding tie between two experts would flip a token's expert)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(make_moe_config(arch), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            if name.endswith("gate.weight") and "shared_expert_gate" not in name:
                p.normal_(0.0, 1.0)
            if "shared_expert_gate" in name:
                p.normal_(0.0, 0.5)
    model.eval()
    model.save_pretrained(str(out_dir))
    return model
