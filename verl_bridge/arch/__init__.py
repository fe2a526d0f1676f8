"""Model architectures: declarative HF <-> megatron-core name maps, config translation, HF loading.

One module per architecture (``llama``, ``qwen2``, ``mistral``, ``opt``, and the Mixture-of-Experts
``mixtral``, ``qwen2_moe``, ``qwen3_moe`` with what they share in ``moe``) holds its name map and
config translation; :mod:`.registry` finds them; :mod:`.fused` is the only tensor code (QKV by
query groups, gate/up); :mod:`.convert` converts and shards single tensors (pure functions, no
process groups); :mod:`.hf` reads HF directories and builds / loads megatron models.

Public API (what the trainer and the weight exporter call)::

    hf_to_mcore_config(hf_dir_or_config) -> (TransformerConfig kwargs, GPTModel kwargs, arch name)
    hf_model_provider(hf_dir) -> model_provider(pre_process, post_process)
    load_hf_weights(model, hf_dir)
    detect_architecture(model_or_config) -> "llama" | "qwen2" | "mistral" | "opt" | "mixtral" | "qwen2_moe"
                                            | "qwen3_moe" | custom
    register_architecture(name, ArchSpec(...))
    mcore_to_hf(name, full_tensor, arch, config) -> [(hf_name, tensor)]
    hf_to_mcore(name, hf_tensors, arch, config) -> full megatron tensor
    shard_for_tp(name, full, tp_size, tp_rank, config) / merge_tp(name, shards, config)

Importing this package does not import torch-heavy megatron modules until a function needs them.
"""

from verl_bridge.arch.convert import (
    ModelDims,
    dims_of,
    hf_sources,
    hf_to_mcore,
    mcore_names,
    mcore_to_hf,
    merge_tp,
    padded_vocab_size,
    shard_for_tp,
)
from verl_bridge.arch.hf import (
    build_gpt_model,
    hf_model_provider,
    hf_to_mcore_config,
    load_hf_weights,
)
from verl_bridge.arch.registry import ArchSpec, detect_architecture, get_arch, register_architecture

__all__ = [
    "ArchSpec", "ModelDims", "build_gpt_model", "detect_architecture", "dims_of", "get_arch",
    "hf_model_provider", "hf_sources", "hf_to_mcore", "hf_to_mcore_config", "load_hf_weights",
    "mcore_names", "mcore_to_hf", "merge_tp", "padded_vocab_size", "register_architecture",
    "shard_for_tp",
]
