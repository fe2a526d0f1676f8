"""A Megatron-LM-style ``get_args()`` namespace for providers that read global args.

Megatron-LM scripts build their model from ``get_args()`` (``from megatron.training import
get_args``), which Megatron-LM's ``initialize_megatron`` fills from command-line flags.
megatron-core alone has no ``get_args``. Two cases:

* **You pass your own ``initialize_megatron``.** It sets your globals; verl-bridge calls it first
  and never touches what it set. (If it fills *this* namespace via :func:`set_args`, that is kept
  as well.)
* **You have no initialiser.** :meth:`MegatronBridge.initialize` fills this namespace from the
  config (:func:`args_from_config`) before the provider runs. A provider reads it with::

      try:                                   # Megatron-LM installed: its own globals
          from megatron.training import get_args
      except ImportError:                    # megatron-core only: verl-bridge's namespace
          from verl_bridge.bridge.megatron_args import get_args

      def model_provider(pre_process=True, post_process=True):
          args = get_args()
          config = TransformerConfig(num_layers=args.num_layers, hidden_size=args.hidden_size, ...)

  (Or, if Megatron-LM *is* installed but its ``initialize_megatron`` is not run, import this
  module's ``get_args`` directly.)

Fields filled from the config (Megatron-LM's names and meanings):

======================================  ====================================================
field                                   from
======================================  ====================================================
num_layers, hidden_size,                ``model.actor.args.<same name>``
num_attention_heads, num_query_groups,  (``num_query_groups`` None -> heads; ``ffn_hidden_size``
ffn_hidden_size, group_query_attention  None -> 4 x hidden)
seq_length, max_position_embeddings     ``data.max_prompt_length + data.max_response_length``
vocab_size, padded_vocab_size,          the tokenizer's vocabulary, padded to a multiple of
make_vocab_size_divisible_by            ``make_vocab_size_divisible_by`` x TP (Megatron-LM's rule)
tensor_model_parallel_size,             the live process groups (``trainer.args``)
pipeline_model_parallel_size,
data_parallel_size, sequence_parallel
params_dtype, bf16, fp16                ``trainer.precision``
seed, load, micro_batch_size,           ``trainer.seed``, ``model.actor.args.load_path``,
global_batch_size, lr, clip_grad        ``algorithm.micro_batch_size``, ``data.rollout_batch_size``,
                                        ``optim.actor.lr`` / ``clip_grad``
======================================  ====================================================

This is a compatibility shim for user code only; verl-bridge's own modules never read it.
"""

from __future__ import annotations

import argparse
from typing import Optional

_ARGS: Optional[argparse.Namespace] = None
_FROM_CONFIG = False  # True while _ARGS is the bridge's fill from a config (replaced by the next bridge)


class ArgsNotSetError(RuntimeError):
    pass


def get_args() -> argparse.Namespace:
    """The namespace set by :func:`set_args` (by the bridge from the config, or by your initialiser)."""
    if _ARGS is None:
        raise ArgsNotSetError(
            "verl_bridge.bridge.megatron_args.get_args() was called before any args were set: run the "
            "provider through MegatronBridge (it fills them from the config when you pass no "
            "initialize_megatron), or call set_args(...) in your own initializer")
    return _ARGS


def set_args(args: Optional[argparse.Namespace]) -> None:
    """Install *args* (``None`` clears them). Args set here by user code are never overwritten."""
    global _ARGS, _FROM_CONFIG
    _ARGS, _FROM_CONFIG = args, False


def is_set() -> bool:
    return _ARGS is not None


def set_from_config(args: argparse.Namespace) -> None:
    """The bridge's fill (no user initializer): replaced by the next bridge's fill, unlike set_args."""
    global _ARGS, _FROM_CONFIG
    _ARGS, _FROM_CONFIG = args, True


def clear_config_fill() -> None:
    """Drop a previous bridge's fill from a config, keep anything user code set."""
    global _ARGS, _FROM_CONFIG
    if _FROM_CONFIG:
        _ARGS, _FROM_CONFIG = None, False


def args_from_config(config, layout=None, vocab_size: Optional[int] = None,
                     make_vocab_size_divisible_by: int = 128) -> argparse.Namespace:
    """Megatron-LM-named args describing the actor of *config* (see the table in the module docstring)."""
    import torch

    from verl_bridge.arch.convert import padded_vocab_size

    m = config.model.actor.args
    tp = layout.tp_size if layout is not None else config.trainer.args.tp_size
    pp = layout.pp_size if layout is not None else config.trainer.args.pp_size
    dp = layout.dp_size if layout is not None else (config.trainer.args.dp_size or 1)
    seq = config.data.max_prompt_length + config.data.max_response_length
    vocab = int(vocab_size) if vocab_size is not None else None  # None: no tokenizer known
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.trainer.precision, torch.float32)
    groups = m.num_query_groups or m.num_attention_heads
    return argparse.Namespace(
        num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads,
        num_query_groups=groups, group_query_attention=groups != m.num_attention_heads,
        ffn_hidden_size=m.ffn_hidden_size or 4 * m.hidden_size,
        seq_length=seq, max_position_embeddings=seq,
        vocab_size=vocab, make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        padded_vocab_size=padded_vocab_size(vocab, tp, make_vocab_size_divisible_by) if vocab else None,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, data_parallel_size=dp,
        expert_model_parallel_size=getattr(layout, "ep_size", None) or config.trainer.args.ep_size or 1,
        **_moe_args(m),
        sequence_parallel=bool(config.trainer.args.sequence_parallel and tp > 1),
        params_dtype=dtype, bf16=config.trainer.precision == "bf16", fp16=config.trainer.precision == "fp16",
        seed=config.trainer.seed, load=m.load_path,
        micro_batch_size=config.algorithm.micro_batch_size, global_batch_size=config.data.rollout_batch_size,
        lr=config.optim.actor.lr, clip_grad=config.optim.actor.clip_grad,
        use_cpu_initialization=not torch.cuda.is_available(),
    )


def _moe_args(m) -> dict:
    """Megatron-LM's MoE args of the ``tiny-moe`` preset (``num_experts`` None: a dense model)."""
    from verl_bridge.models.tiny import moe_config_kwargs

    kw = moe_config_kwargs(m)
    return dict(num_experts=kw.get("num_moe_experts"), moe_router_topk=kw.get("moe_router_topk", 2),
                moe_ffn_hidden_size=kw.get("moe_ffn_hidden_size"),
                moe_shared_expert_intermediate_size=kw.get("moe_shared_expert_intermediate_size"),
                moe_aux_loss_coeff=kw.get("moe_aux_loss_coeff", 0.0))
