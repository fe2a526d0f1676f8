"""Tiny random Hugging Face models saved locally (no downloads) for conversion tests."""

from __future__ import annotations

import torch

# vocab 100 is not a multiple of 128: exercises megatron's vocabulary padding.
COMMON = dict(vocab_size=100, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
              max_position_embeddings=64)


def make_config(arch: str):
    from transformers import LlamaConfig, MistralConfig, OPTConfig, Qwen2Config

    if arch == "llama":
        return LlamaConfig(**COMMON, intermediate_size=64, num_key_value_heads=2, rms_norm_eps=1e-6,
                           tie_word_embeddings=False, head_dim=8)
    if arch == "qwen2":  # QKV bias, GQA, tied embeddings
        return Qwen2Config(**COMMON, intermediate_size=64, num_key_value_heads=2, rms_norm_eps=1e-6,
                           tie_word_embeddings=True, rope_parameters={"rope_theta": 1e6, "rope_type": "default"})
    if arch == "mistral":
        return MistralConfig(**COMMON, intermediate_size=64, num_key_value_heads=2, rms_norm_eps=1e-5,
                             tie_word_embeddings=False, head_dim=8, sliding_window=4096,
                             rope_parameters={"rope_theta": 1e6, "rope_type": "default"})
    if arch == "opt":  # learned positions (offset 2), LayerNorm, ReLU, biases, tied
        return OPTConfig(vocab_size=100, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
                         ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=32,
                         do_layer_norm_before=True, dropout=0.0, attention_dropout=0.0,
                         activation_dropout=0.0, pad_token_id=1)
    raise ValueError(arch)


def make_tiny_hf(arch: str, out_dir, seed: int = 0):
    """Save a random tiny model of *arch* to *out_dir*; return the in-memory HF model (fp32, eval)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(make_config(arch), dtype=torch.float32)
    with torch.no_grad():  # norms init to 1/0: perturb them so a swapped norm would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.eval()
    model.save_pretrained(str(out_dir))
    return model


ARCHS = ("llama", "qwen2", "mistral", "opt")
