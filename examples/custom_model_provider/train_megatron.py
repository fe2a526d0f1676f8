"""A Megatron-LM-style training script: the user's own code, which verl-bridge wraps unchanged.

It has the three functions every Megatron-LM script has:

* ``initialize_megatron(extra_args_provider=None, args_defaults={})`` parses Megatron-style flags
  (``--tensor-model-parallel-size``, ``--num-layers``, ``--hidden-size``, ``--seq-length``,
  ``--load`` ...) into module-global args read by ``get_args()``, initialises torch.distributed and
  megatron-core's ``parallel_state``;
* ``model_provider(pre_process=True, post_process=True)`` builds a megatron-core GPTModel from
  ``get_args()``;
* ``load_checkpoint(model, optimizer, opt_param_scheduler)`` reads Megatron-LM's legacy layout
  (``<load>/latest_checkpointed_iteration.txt``, ``iter_XXXXXXX/mp_rank_XX/model_optim_rng.pt``).

Run on its own, ``--save-init`` writes a freshly initialised model as iteration 0 under ``--save``
(the small checkpoint that rl.py then loads):

    python examples/custom_model_provider/train_megatron.py --save-init --save /tmp/cmp_ckpt
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from megatron.core import parallel_state as mpu
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig

_GLOBAL_ARGS = None


def get_args() -> argparse.Namespace:
    """Megatron-LM's accessor for the parsed flags (set by initialize_megatron)."""
    if _GLOBAL_ARGS is None:
        raise RuntimeError("get_args() before initialize_megatron()")
    return _GLOBAL_ARGS


def parse_args(extra_args_provider=None, ignore_unknown_args=False, argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Megatron-style arguments", allow_abbrev=False)
    g = parser.add_argument_group("network size")
    g.add_argument("--num-layers", type=int, default=None)
    g.add_argument("--hidden-size", type=int, default=None)
    g.add_argument("--ffn-hidden-size", type=int, default=None)
    g.add_argument("--num-attention-heads", type=int, default=None)
    g.add_argument("--group-query-attention", action="store_true")
    g.add_argument("--num-query-groups", type=int, default=1)
    g.add_argument("--seq-length", type=int, default=None)
    g.add_argument("--max-position-embeddings", type=int, default=None)
    g.add_argument("--vocab-size", type=int, default=None)
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    g.add_argument("--normalization", default="RMSNorm", choices=["LayerNorm", "RMSNorm"])
    g.add_argument("--swiglu", action="store_true")
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    g = parser.add_argument_group("distributed")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--distributed-backend", default="nccl" if torch.cuda.is_available() else "gloo")
    g = parser.add_argument_group("training")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--bf16", action="store_true")
    g.add_argument("--micro-batch-size", type=int, default=1)
    g.add_argument("--lr", type=float, default=None)
    g = parser.add_argument_group("checkpointing")
    g.add_argument("--load", default=None)
    g.add_argument("--save", default=None)
    g.add_argument("--save-init", action="store_true", help="write the initial model as iteration 0 and exit")
    if extra_args_provider is not None:
        parser = extra_args_provider(parser)
    argv = sys.argv[1:] if argv is None else argv
    if ignore_unknown_args:
        args, _ = parser.parse_known_args(argv)
    else:
        args = parser.parse_args(argv)
    return args


def _vocab_size_with_padding(orig: int, args) -> int:
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    return ((orig + multiple - 1) // multiple) * multiple


def initialize_megatron(extra_args_provider=None, args_defaults={}, ignore_unknown_args=False):  # noqa: B006 (Megatron-LM's own signature)
    global _GLOBAL_ARGS
    args = parse_args(extra_args_provider, ignore_unknown_args)
    for key, value in args_defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = 4 * args.hidden_size
    if not args.group_query_attention:
        args.num_query_groups = args.num_attention_heads
    args.padded_vocab_size = _vocab_size_with_padding(args.vocab_size, args)
    args.params_dtype = torch.bfloat16 if args.bf16 else torch.float32

    if not torch.distributed.is_initialized():
        if "MASTER_PORT" not in os.environ:  # plain `python`, a world of one
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1")
        torch.distributed.init_process_group(backend=args.distributed_backend,
                                             rank=int(os.environ.get("RANK", 0)),
                                             world_size=int(os.environ.get("WORLD_SIZE", 1)))
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    mpu.initialize_model_parallel(tensor_model_parallel_size=args.tensor_model_parallel_size,
                                  pipeline_model_parallel_size=args.pipeline_model_parallel_size)
    torch.manual_seed(args.seed)
    _GLOBAL_ARGS = args


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_provider(pre_process=True, post_process=True) -> GPTModel:
    args = get_args()
    config = TransformerConfig(
        num_layers=args.num_layers, hidden_size=args.hidden_size, ffn_hidden_size=args.ffn_hidden_size,
        num_attention_heads=args.num_attention_heads, num_query_groups=args.num_query_groups,
        normalization=args.normalization, gated_linear_unit=args.swiglu,
        activation_func=F.silu if args.swiglu else F.gelu, add_bias_linear=False,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        params_dtype=args.params_dtype, bf16=args.bf16, init_method_std=0.02,
        # fused kernels and dropout off: these run anywhere (GPU users keep their own settings)
        use_cpu_initialization=not torch.cuda.is_available(), bias_dropout_fusion=False,
        masked_softmax_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
        apply_rope_fusion=False, hidden_dropout=0.0, attention_dropout=0.0,
    )
    # On a GPU, this is where your own spec goes (get_gpt_layer_local_spec() or the Transformer
    # Engine spec). The CPU needs SDPA attention, which verl-bridge's portable spec provides;
    # make_cpu_safe fixes RoPE's CUDA-only cache on CPU (it changes nothing on GPU).
    from verl_bridge.compat import make_cpu_safe
    from verl_bridge.models.spec import get_portable_gpt_layer_spec

    model = GPTModel(
        config=config, transformer_layer_spec=get_portable_gpt_layer_spec(args.normalization),
        vocab_size=args.padded_vocab_size, max_sequence_length=args.max_position_embeddings,
        pre_process=pre_process, post_process=post_process, position_embedding_type="rope",
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
    )
    return make_cpu_safe(model)


def _checkpoint_file(root: str, iteration: int) -> str:
    rank = f"mp_rank_{mpu.get_tensor_model_parallel_rank():02d}"
    if mpu.get_pipeline_model_parallel_world_size() > 1:
        rank += f"_{mpu.get_pipeline_model_parallel_rank():03d}"
    return os.path.join(root, f"iter_{iteration:07d}", rank, "model_optim_rng.pt")


def load_checkpoint(model, optimizer, opt_param_scheduler):
    """Megatron-LM's legacy reader: returns the iteration loaded (0 when --load is unset)."""
    args = get_args()
    if not args.load:
        return 0
    with open(os.path.join(args.load, "latest_checkpointed_iteration.txt")) as f:
        iteration = int(f.read().strip())
    state = torch.load(_checkpoint_file(args.load, iteration), map_location="cpu", weights_only=False)
    model = model if isinstance(model, list) else [model]
    model[0].load_state_dict(state["model"], strict=True)
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    if torch.distributed.get_rank() == 0:
        print(f" loaded checkpoint from {args.load} at iteration {iteration}")
    return iteration


def save_checkpoint(iteration, model, optimizer, opt_param_scheduler):
    args = get_args()
    model = model if isinstance(model, list) else [model]
    if mpu.get_data_parallel_rank() == 0:
        path = _checkpoint_file(args.save, iteration)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save({"model": model[0].state_dict_for_save_checkpoint(), "iteration": iteration, "args": args,
                    "checkpoint_version": 3.0}, path)
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        with open(os.path.join(args.save, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(iteration))


if __name__ == "__main__":
    initialize_megatron()
    args = get_args()
    if args.save_init:
        if not args.save:
            sys.exit("--save-init needs --save DIR")
        save_checkpoint(0, [model_provider()], None, None)
        print(f"wrote the initial model to {args.save}")
    mpu.destroy_model_parallel()
    torch.distributed.destroy_process_group()
