"""RL (GRPO, PPO, ...) on a Megatron-LM GPT, starting from a checkpoint Megatron-LM wrote.

    torchrun --nproc-per-node 1 examples/megatron_lm/rl_gpt.py --rl-config templates/grpo.yaml \\
        [--rl-set trainer.total_steps=3 ...] <your Megatron-LM flags> \\
        --load CKPT --finetune --no-load-optim --no-load-rng

Everything Megatron-side is Megatron-LM's own code (``megatron.training``: megatron-core >= 0.17
wheels ship it, or a Megatron-LM checkout on ``PYTHONPATH``):

* ``initialize_megatron``: Megatron-LM >= 0.19 (``core_v0.19``) no longer parses the flags in
  ``initialize_megatron()``; call ``parse_and_validate_args()`` first, else it fails with
  ``AssertionError: args is not initialized``. Megatron-LM <= 0.18 parses them inside
  ``initialize_megatron()``. :func:`initialize` does whichever the installed version needs.
* ``model_provider``: with a Megatron-LM checkout on ``PYTHONPATH``, its root
  ``model_provider(model_builder, ...)`` with ``gpt_builders.gpt_builder`` (the bridge passes the
  builder); otherwise :func:`model_provider` below, the same GPT for ``--transformer-impl local``.
* ``load_checkpoint``: ``megatron.training.checkpointing.load_checkpoint``, unchanged. ``--finetune
  --no-load-optim --no-load-rng`` take the weights only (the RL optimizer starts fresh), from either
  ``--ckpt-format torch`` (legacy) or ``torch_dist``.

Without apex, Megatron-LM needs ``--no-persist-layer-norm --no-masked-softmax-fusion`` (and
``--no-gradient-accumulation-fusion``); without Transformer Engine, ``--transformer-impl local``.
With ``--bf16`` / ``--fp16`` the bridge casts the model as ``get_model()``'s ``Float16Module`` does.

tests/gpu/megatron_lm_flow.py runs this on a GPU from checkpoints Megatron-LM's ``save_checkpoint``
wrote in both formats.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys


def initialize() -> None:
    """Megatron-LM's initialisation, for Megatron-LM >= 0.19 and <= 0.18 alike (reads ``sys.argv``)."""
    from megatron.training import initialize_megatron

    _skip_helper_compile_if_prebuilt()
    if "extra_args_provider" in inspect.signature(initialize_megatron).parameters:
        initialize_megatron()  # <= 0.18: parses the flags itself
    else:  # >= 0.19: parse first, else "AssertionError: args is not initialized"
        from megatron.training.arguments import parse_and_validate_args

        parse_and_validate_args()
        initialize_megatron()


def _skip_helper_compile_if_prebuilt() -> None:
    """megatron-core's wheel ships the dataset helpers prebuilt (``helpers_cpp``) but not the Makefile
    that ``initialize_megatron`` runs ``make`` on; a Megatron-LM checkout has it and compiles as usual."""
    import importlib.util

    import megatron.core.datasets.utils as dutils

    here = os.path.dirname(dutils.__file__)
    if os.path.exists(os.path.join(here, "Makefile")) or importlib.util.find_spec(
            "megatron.core.datasets.helpers_cpp") is None:
        return
    dutils.compile_helpers = lambda: print("> dataset helpers: prebuilt in the megatron-core wheel, no make")


def gpt_model(config, args, layer_spec, pre_process: bool = True, post_process: bool = True, vp_stage=None):
    """A GPTModel the way Megatron-LM's ``gpt_builders.gpt_builder`` builds one from its args."""
    from megatron.core.models.gpt import GPTModel

    kwargs = {}
    if vp_stage is not None:
        kwargs["vp_stage"] = vp_stage
    return GPTModel(
        config=config, transformer_layer_spec=layer_spec, vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings, pre_process=pre_process, post_process=post_process,
        fp16_lm_cross_entropy=getattr(args, "fp16_lm_cross_entropy", False), parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type, **kwargs,
    )


def model_provider(pre_process=True, post_process=True, vp_stage=None, config=None, pg_collection=None):
    """Megatron-LM's GPT for ``--transformer-impl local`` (no Transformer Engine), from ``get_args()``."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.training import get_args
    from megatron.training.arguments import core_transformer_config_from_args

    args = get_args()
    if config is None:
        config = core_transformer_config_from_args(args)
    spec = get_gpt_layer_local_spec(normalization=args.normalization)
    return gpt_model(config, args, spec, pre_process, post_process, vp_stage)


def megatron_lm_hooks():
    """(model_provider, model_builder): a Megatron-LM checkout's root provider + gpt_builder if
    importable, else this file's provider."""
    try:
        from gpt_builders import gpt_builder
        from model_provider import model_provider as root_provider
    except ImportError:
        return model_provider, None
    return root_provider, gpt_builder


def main() -> None:
    try:
        from megatron.training.checkpointing import load_checkpoint
    except ImportError as exc:
        print(f"error: this example runs Megatron-LM's own code and cannot import it ({exc}). Install "
                 "megatron-core >= 0.17 (its wheel ships megatron.training; Python >= 3.12) or put a Megatron-LM "
                 "checkout on PYTHONPATH; `verl-bridge doctor` checks the environment.", file=sys.stderr)
        sys.exit(2)

    from verl_bridge import MegatronBridge, MegatronTrainer

    ours = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ours.add_argument("--rl-config", required=True, help="verl-bridge YAML (e.g. templates/grpo.yaml)")
    ours.add_argument("--rl-set", action="append", default=[], help="key=value override (repeatable)")
    rl, megatron_flags = ours.parse_known_args()
    sys.argv = [sys.argv[0], *megatron_flags]  # what Megatron-LM's parser reads
    provider, builder = megatron_lm_hooks()
    bridge = MegatronBridge(provider, initialize_megatron=initialize, load_checkpoint=load_checkpoint,
                            model_builder=builder)
    MegatronTrainer(bridge.load_config(rl.rl_config, rl.rl_set), bridge=bridge).train()


if __name__ == "__main__":
    main()
