"""Which HF architecture a provider's model is, and whether its name map covers every tensor.

:func:`resolve_architecture` is what resharding and HF export rely on for a user's model: it
detects the architecture from the model's TransformerConfig and module structure
(:func:`verl_bridge.arch.detect_architecture`; custom registrations first), then checks the
model's parameters against that architecture's declarative name map both ways. A parameter the
map does not cover, or a map entry the model does not have, is a ``ValueError`` that names the
parameter: nothing is guessed.

A custom model registers its map in a few lines::

    from verl_bridge.arch import ArchSpec, register_architecture
    from verl_bridge.arch.llama import FROM_HF
    register_architecture("my_gpt", ArchSpec(
        name="my_gpt", hf_architectures=("MyGPTForCausalLM",), hf_model_type="my_gpt",
        from_hf={**FROM_HF, "model.layers.{}.input_layernorm.bias": "decoder.layers.{}.input_layernorm.bias", ...},
        features={"normalization": "LayerNorm", "gated_linear_unit": True, "position_embedding_type": "rope"}))
"""

from __future__ import annotations

from typing import Optional

import torch


def _ep_layout(model: torch.nn.Module) -> tuple[int, int, Optional[int]]:
    """(EP size, EP rank, experts per EP rank or None for a dense model) from megatron's parallel state."""
    from verl_bridge.arch.hf import local_expert_count
    from verl_bridge.distributed.state import model_parallel_state

    ps = model_parallel_state()
    ep_size, ep_rank = (1, 0) if ps is None else (ps.ep_size, ps.ep_rank)
    return ep_size, ep_rank, local_expert_count(model, ep_size)


def _model_names(model: torch.nn.Module) -> list[str]:
    """Parameter names with global layer indices (a PP stage's local layer i -> offset + i) and
    global expert indices (EP rank r's local expert j -> r * E/ep + j)."""
    from verl_bridge.arch.convert import to_global_name

    offset = 0
    decoder = getattr(model, "decoder", None)
    layers = getattr(decoder, "layers", None)
    if layers is not None and len(layers) and hasattr(layers[0], "layer_number"):
        offset = layers[0].layer_number - 1  # megatron numbers layers from 1, globally
    _, ep_rank, n_local = _ep_layout(model)
    return [to_global_name(n, offset, ep_rank=ep_rank, num_local_experts=n_local) for n, _ in model.named_parameters()]


def resolve_architecture(model: torch.nn.Module, arch: Optional[str] = None) -> str:
    """Name of *model*'s registered architecture, after checking its name map covers the model.

    *arch* skips detection (checks the given map instead). Raises ``ValueError`` naming the first
    uncovered parameter (and how many more), or map entries the model lacks. Mixture-of-Experts
    models (megatron's ``MoELayer``: router, ``SequentialMLP`` experts, shared experts) match the
    Mixtral / Qwen2-MoE / Qwen3-MoE maps; what those maps do not cover (multi-latent attention,
    grouped top-k, sigmoid scores, expert bias, ...) is named in the error (see
    :mod:`verl_bridge.arch.moe`). Under expert parallelism the rank's experts are checked by their
    global indices.
    """
    from verl_bridge.arch import detect_architecture, get_arch, mcore_names
    from verl_bridge.arch.convert import hf_sources

    name = arch or detect_architecture(model)
    spec = get_arch(name)
    have = _model_names(model)
    uncovered = []
    for p in have:
        try:
            hf_sources(p, spec)
        except ValueError:
            uncovered.append(p)
    if uncovered:
        more = f" (and {len(uncovered) - 1} more: {', '.join(uncovered[1:4])}{', ...' if len(uncovered) > 4 else ''})" \
            if len(uncovered) > 1 else ""
        raise ValueError(f"parameter {uncovered[0]} is not covered by the name map of architecture "
                         f"'{name}'{more}; add it to the map registered with register_architecture")
    pp_stage = len(getattr(getattr(model, "decoder", None), "layers", [])) != model.config.num_layers
    if not pp_stage:  # a whole model: every map entry must exist too (this EP rank's experts)
        from verl_bridge.arch.convert import expert_index

        ep_size, ep_rank, n_local = _ep_layout(model)
        expected = {n for n in mcore_names(spec, _dims_config(model))
                    if n_local is None or expert_index(n) is None or expert_index(n) // n_local == ep_rank}
        missing = sorted(expected - set(have))
        if missing:
            raise ValueError(f"the name map of architecture '{name}' has {missing[0]}"
                             + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                             + " which this model does not have; remove it from the map or fix the model")
    return name


def _dims_config(model):
    """The model's TransformerConfig plus the GPTModel facts dims_of() reads (tied embeddings)."""
    from types import SimpleNamespace

    cfg = model.config
    return SimpleNamespace(**{k: getattr(cfg, k) for k in (
        "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
        "ffn_hidden_size", "gated_linear_unit", "num_moe_experts")},
        share_embeddings_and_output_weights=bool(getattr(model, "share_embeddings_and_output_weights", False)))
