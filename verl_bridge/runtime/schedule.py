"""The forward/backward schedule: megatron-core's on CUDA, a CPU one with the same contract.

megatron-core's ``get_forward_backward_func()`` returns ``forward_backward_no_pipelining`` for
PP=1, but in 0.12-0.19 that function allocates its token counter with ``device="cuda"``, and the
pipelined schedules allocate their P2P buffers on CUDA. On CPU we therefore run
:func:`cpu_forward_backward_no_pipelining`, which follows the same contract (the same
``forward_step_func(data_iterator, model) -> (output, loss_func)``, the same
``loss_func(output) -> (loss, [num_tokens,] reduced_dict)`` and the same return value: the list of
per-micro-batch reduced dicts). PP>1 needs CUDA; the trainer refuses it on CPU before starting.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch


def cpu_forward_backward_no_pipelining(
    *,
    forward_step_func: Callable,
    data_iterator: Iterator,
    model,
    num_microbatches: int,
    seq_length: int = 0,
    micro_batch_size: int = 0,
    decoder_seq_length=None,
    forward_only: bool = False,
    collect_non_loss_data: bool = False,
    first_val_step=None,
    **_: object,
) -> list:
    chunks = model if isinstance(model, (list, tuple)) else [model]
    if len(chunks) != 1:
        raise ValueError(f"the CPU schedule runs one model chunk, got {len(chunks)} (virtual pipeline needs CUDA)")
    module = chunks[0]
    reduced = []
    for _ in range(num_microbatches):
        with torch.set_grad_enabled(not forward_only):
            output, loss_func = forward_step_func(data_iterator, module)
            result = loss_func(output)
        if len(result) == 3:
            loss, _num_tokens, stats = result
        else:
            loss, stats = result
        if not forward_only:
            (loss / num_microbatches).backward()
        reduced.append(stats)
    return reduced


def get_forward_backward_func(pp_size: int = 1) -> Callable:
    if torch.cuda.is_available():
        from megatron.core.pipeline_parallel import get_forward_backward_func as mcore_fb

        return mcore_fb()
    if pp_size > 1:
        raise RuntimeError(
            f"pipeline parallelism (pp_size={pp_size}) needs CUDA: megatron-core's pipeline schedules "
            "allocate their buffers on the GPU. Use trainer.args.pp_size=1 on CPU."
        )
    return cpu_forward_backward_no_pipelining
