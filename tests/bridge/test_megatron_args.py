"""Providers that read Megatron-LM-style get_args(): filled from the config without an initializer,
left exactly as the user's initializer set them otherwise."""

import argparse

import pytest

from tests.dist_utils import run_distributed


def provider_reading_args(pre_process=True, post_process=True):
    """A Megatron-LM-style provider: every size comes from get_args()."""
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from verl_bridge.bridge.megatron_args import get_args
    from verl_bridge.models.spec import get_portable_gpt_layer_spec

    args = get_args()
    config = TransformerConfig(
        num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=args.num_attention_heads,
        num_query_groups=args.num_query_groups, ffn_hidden_size=args.ffn_hidden_size, normalization="RMSNorm",
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        tensor_model_parallel_size=args.tensor_model_parallel_size, params_dtype=args.params_dtype,
        use_cpu_initialization=True, bias_dropout_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False, persist_layer_norm=False, apply_rope_fusion=False,
        hidden_dropout=0.0, attention_dropout=0.0)
    return GPTModel(config=config, transformer_layer_spec=get_portable_gpt_layer_spec("RMSNorm"),
                    vocab_size=args.padded_vocab_size, max_sequence_length=args.max_position_embeddings,
                    pre_process=pre_process, post_process=post_process, position_embedding_type="rope",
                    share_embeddings_and_output_weights=False)


USER_ARGS = {}


def users_initializer():
    """Sets its own globals (hidden 32, 1 layer) and its own parallel state, as Megatron-LM's does."""
    from megatron.core import parallel_state as mpu

    from verl_bridge.bridge import megatron_args

    ns = argparse.Namespace(num_layers=1, hidden_size=32, num_attention_heads=4, num_query_groups=4,
                            ffn_hidden_size=64, tensor_model_parallel_size=1, params_dtype=None,
                            padded_vocab_size=32, max_position_embeddings=24, marker="user's")
    import torch

    ns.params_dtype = torch.float32
    USER_ARGS["ns"] = ns
    megatron_args.set_args(ns)
    mpu.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)


def _cfg(extra=(), world_size=1):
    from verl_bridge.config import load_config

    return load_config("templates/quickstart.yaml", [
        "model.actor.args.preset=null",
        "model.actor.args.model_provider=tests.bridge.test_megatron_args:provider_reading_args",
        "model.actor.args.num_layers=3", "model.actor.args.hidden_size=48", "model.actor.args.num_attention_heads=4",
        "model.critic=null", "trainer.output_dir=null", "data.max_prompt_length=10", "data.max_response_length=6",
        *extra], world_size=world_size)


def _both_paths(rank, world_size):
    from megatron.core import parallel_state as mpu

    from verl_bridge.bridge import MegatronBridge, megatron_args

    out = {}
    megatron_args.set_args(None)
    try:
        megatron_args.get_args()
    except megatron_args.ArgsNotSetError as e:
        out["unset_error"] = str(e)

    # 1. no initializer: the bridge fills the namespace from the config, the provider builds from it
    bridge = MegatronBridge.from_config(_cfg())
    bridge.initialize()
    a = megatron_args.get_args()
    out["filled"] = {k: getattr(a, k) for k in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                                                "max_position_embeddings", "padded_vocab_size", "vocab_size",
                                                "tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                "ffn_hidden_size", "num_query_groups")}
    actor = bridge.build_roles().actor
    out["built"] = (actor.config.num_layers, actor.config.hidden_size,
                    tuple(actor.embedding.word_embeddings.weight.shape))
    mpu.destroy_model_parallel()

    # 2. the user's initializer set its own args: they are used as set, not overwritten by the config
    bridge = MegatronBridge.from_config(_cfg(
        ["model.actor.args.initialize_megatron=tests.bridge.test_megatron_args:users_initializer"]))
    bridge.initialize()
    out["user_args_kept"] = megatron_args.get_args() is USER_ARGS["ns"] and megatron_args.get_args().marker == "user's"
    out["user_args_untouched"] = not hasattr(USER_ARGS["ns"], "seq_length")
    actor = bridge.build_roles().actor
    out["built_user"] = (actor.config.num_layers, actor.config.hidden_size,
                         tuple(actor.embedding.word_embeddings.weight.shape))
    mpu.destroy_model_parallel()

    # 3. a later bridge without an initializer does not overwrite what user code set
    bridge = MegatronBridge.from_config(_cfg())
    bridge.initialize()
    out["still_user"] = megatron_args.get_args() is USER_ARGS["ns"]
    megatron_args.set_args(None)
    return out


def test_get_args_from_config_and_from_users_initializer():
    out = run_distributed(_both_paths, 1)[0]
    assert "before any args were set" in out["unset_error"]
    assert out["filled"] == {
        "num_layers": 3, "hidden_size": 48, "num_attention_heads": 4, "seq_length": 16,
        "max_position_embeddings": 16, "padded_vocab_size": 128, "vocab_size": 16,  # toy vocab, Megatron padding
        "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "ffn_hidden_size": 192,
        "num_query_groups": 4}
    assert out["built"] == (3, 48, (128, 48))
    assert out["user_args_kept"] and out["user_args_untouched"]
    assert out["built_user"] == (1, 32, (32, 32))
    assert out["still_user"]


def test_args_from_config_pads_for_tensor_parallel():
    from types import SimpleNamespace

    from verl_bridge.bridge.megatron_args import args_from_config

    cfg = _cfg(["trainer.args.tp_size=2"], world_size=2)
    layout = SimpleNamespace(tp_size=2, pp_size=1, dp_size=1)
    a = args_from_config(cfg, layout, vocab_size=300)
    assert a.padded_vocab_size == 512 and a.tensor_model_parallel_size == 2   # multiple of 128 x TP
    assert a.seq_length == 16 and a.load is None


@pytest.mark.parametrize("name", ["num_layers", "hidden_size", "padded_vocab_size", "seq_length",
                                  "tensor_model_parallel_size", "pipeline_model_parallel_size", "params_dtype"])
def test_namespace_has_the_megatron_lm_names(name):
    from verl_bridge.bridge.megatron_args import args_from_config

    assert hasattr(args_from_config(_cfg()), name)


def test_python_hooks_are_named_in_the_config_they_load():
    from verl_bridge.bridge import MegatronBridge

    bridge = MegatronBridge(provider_reading_args, users_initializer)
    cfg = bridge.load_config("templates/quickstart.yaml", ["model.actor.args.preset=null", "trainer.output_dir=null"])
    assert bridge.config is cfg
    assert cfg.model.actor.args.model_provider == "tests.bridge.test_megatron_args:provider_reading_args"
    assert cfg.model.actor.args.initialize_megatron == "tests.bridge.test_megatron_args:users_initializer"
    assert cfg.model.actor.args.load_checkpoint is None

    def local_provider(pre_process=True, post_process=True):
        raise AssertionError("never called")

    # a closure cannot be named: it is used as given, and the template's preset is still cleared
    local = MegatronBridge(local_provider).load_config("templates/quickstart.yaml", ["trainer.output_dir=null"])
    assert local.model.actor.args.model_provider is None and local.model.actor.args.preset is None
