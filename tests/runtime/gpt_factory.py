"""Small real megatron-core ``GPTModel``s for the runtime tests (call inside a process group)."""

from __future__ import annotations

import torch


class _SPTaggedRMSNorm:
    """torch RMSNorm whose parameters carry ``sequence_parallel`` as TENorm / FusedLayerNorm set it.

    Stand-in for the SP-capable norms of Transformer Engine / apex, absent on this CPU machine
    (megatron-core's torch-norm wrapper refuses ``sequence_parallel``)."""

    def __new__(cls, config, hidden_size, eps=1e-5, **_):
        norm = torch.nn.RMSNorm(hidden_size, eps=eps)
        for p in norm.parameters():
            p.sequence_parallel = config.sequence_parallel
        return norm


def build_gpt(tp: int = 1, sequence_parallel: bool = False, pre_process: bool = True, post_process: bool = True,
              tied: bool = False, layers: int = 2, vocab_size: int = 64, dropout: float = 0.0):
    """A 2-layer, hidden-32 Llama-style GPTModel (RMSNorm, SwiGLU, RoPE) on the portable spec."""
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
    from megatron.core.transformer.transformer_config import TransformerConfig

    from verl_bridge.compat import make_cpu_safe
    from verl_bridge.models.spec import get_portable_gpt_layer_spec
    from verl_bridge.models.tiny import transformer_config_kwargs

    layer = get_portable_gpt_layer_spec("RMSNorm")
    spec = layer
    if sequence_parallel:
        layer.submodules.input_layernorm = _SPTaggedRMSNorm
        layer.submodules.pre_mlp_layernorm = _SPTaggedRMSNorm
        spec = TransformerBlockSubmodules(layer_specs=[layer] * layers, layer_norm=_SPTaggedRMSNorm)
    kwargs = {**transformer_config_kwargs("fp32"), "hidden_dropout": dropout, "attention_dropout": dropout}
    config = TransformerConfig(
        num_layers=layers, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, normalization="RMSNorm",
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, tensor_model_parallel_size=tp,
        sequence_parallel=sequence_parallel, **kwargs)
    return make_cpu_safe(GPTModel(config=config, transformer_layer_spec=spec, vocab_size=vocab_size,
                                  max_sequence_length=32, pre_process=pre_process, post_process=post_process,
                                  position_embedding_type="rope", share_embeddings_and_output_weights=tied))
