"""Tiny HF models for the resharding tests (no downloads)."""

from __future__ import annotations

import torch

from tests.arch.tiny_hf import make_config, make_tiny_hf

ARCHS = ("llama", "qwen2")
HF_VOCAB = 100


def make_deep_llama(out_dir, layers: int = 16, seed: int = 1):
    """A tiny Llama with many layers: the model is many times bigger than its largest tensor."""
    from transformers import AutoModelForCausalLM

    cfg = make_config("llama")
    cfg.num_hidden_layers = layers
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    model.save_pretrained(str(out_dir))
    return model


def make_dirs(tmp_path) -> dict[str, str]:
    dirs = {}
    for arch in ARCHS:
        dirs[arch] = str(tmp_path / arch)
        make_tiny_hf(arch, dirs[arch])
    dirs["opt"] = str(tmp_path / "opt")  # the coalesced export checks only
    make_tiny_hf("opt", dirs["opt"])
    dirs["deep_llama"] = str(tmp_path / "deep_llama")
    make_deep_llama(dirs["deep_llama"])
    return dirs
