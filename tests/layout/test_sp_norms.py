"""Sequence parallelism: a provider whose norms cannot run it is refused at model build, on every
rank the same way, with the module named and what would work; the portable spec's norms are tagged."""

from __future__ import annotations

import pytest
import torch

from tests.dist_utils import run_distributed


def _provider(norm: str):
    def provider(pre_process: bool = True, post_process: bool = True):
        import torch.nn.functional as F
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
        from megatron.core.transformer.transformer_config import TransformerConfig

        config = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                                   normalization="LayerNorm", gated_linear_unit=True, activation_func=F.silu,
                                   add_bias_linear=False, use_cpu_initialization=True, tensor_model_parallel_size=2,
                                   sequence_parallel=True, masked_softmax_fusion=False, bias_dropout_fusion=False)
        spec = get_gpt_layer_local_spec(normalization="LayerNorm")
        if norm == "plain":  # builds, but its weights are not tagged for SP
            class PlainNorm:
                def __new__(cls, config, hidden_size, eps=1e-5, **_):
                    return torch.nn.LayerNorm(hidden_size, eps=eps)

            spec.submodules.input_layernorm = PlainNorm
            spec.submodules.pre_mlp_layernorm = PlainNorm
            spec = TransformerBlockSubmodules(layer_specs=[spec] * 2, layer_norm=PlainNorm)
        return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=16, max_sequence_length=64,
                        pre_process=pre_process, post_process=post_process)

    return provider


def _build(rank, world_size, norm):
    from verl_bridge.bridge import MegatronBridge
    from verl_bridge.compat.sequence_parallel import SequenceParallelNormError

    bridge = MegatronBridge(model_provider=_provider(norm))
    bridge.load_config("templates/quickstart.yaml", ["trainer.args.tp_size=2", "trainer.args.sequence_parallel=true",
                                                     "trainer.output_dir=null"], world_size=world_size)
    bridge.initialize()
    try:
        bridge.actor_builder()()
    except SequenceParallelNormError as exc:
        return str(exc)
    return None


@pytest.mark.slow
def test_torch_norm_provider_refused_by_name():
    msgs = run_distributed(_build, 2, "wrapped")
    assert msgs[0] == msgs[1]  # every rank the same way
    assert "WrappedTorchNorm" in msgs[0] and "PortableNorm" in msgs[0] and "sequence_parallel=false" in msgs[0]
    assert "AssertionError" not in msgs[0]


@pytest.mark.slow
def test_untagged_norm_refused_by_name():
    msgs = run_distributed(_build, 2, "plain")
    assert msgs[0] == msgs[1]
    assert "decoder.layers.0.input_layernorm" in msgs[0] and "torch.nn.modules.normalization.LayerNorm" in msgs[0]


def _portable(rank, world_size):
    from megatron.core import parallel_state as mpu

    from verl_bridge.compat.sequence_parallel import untagged_norms
    from verl_bridge.models.tiny import tiny_model_provider
    from types import SimpleNamespace

    mpu.initialize_model_parallel(2, 1)
    args = SimpleNamespace(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=None,
                           ffn_hidden_size=64)
    model = tiny_model_provider(args, 16, 32, tp_size=2, sequence_parallel=True)()
    norms = [n for n, m in model.named_modules() if isinstance(m, torch.nn.RMSNorm)]
    return norms, untagged_norms(model)


def test_portable_spec_norms_are_sp_tagged():
    norms, untagged = run_distributed(_portable, 2)[0]
    assert "decoder.final_layernorm" in norms and len(norms) == 5
    assert untagged == []
