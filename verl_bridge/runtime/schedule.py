"""The forward/backward schedule: megatron-core's own, on CUDA and (pipelined) on the CPU.

* CUDA: megatron-core's ``get_forward_backward_func()``, unchanged.
* CPU, PP > 1: megatron-core's pipelined schedules (1F1B; the interleaved one with a virtual
  pipeline) over gloo, through the named shims of :mod:`verl_bridge.compat.pipeline` (receive
  buffers on the CPU, the token counter off CUDA).
* CPU, PP = 1: :func:`cpu_forward_backward_no_pipelining`, which follows the contract of
  megatron's ``forward_backward_no_pipelining`` (the same
  ``forward_step_func(data_iterator, model) -> (output, loss_func)``, the same
  ``loss_func(output) -> (loss, [num_tokens,] reduced_dict)`` and the same return value: the list of
  per-micro-batch reduced dicts).
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from verl_bridge.compat.cpu_device import cpu_device_shims


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
    if not forward_only:
        set_moe_aux_loss_scale(module, num_microbatches)
    with cpu_device_shims():
        _loop(forward_step_func, data_iterator, module, num_microbatches, forward_only, reduced)
    return reduced


def set_moe_aux_loss_scale(module, num_microbatches: int) -> None:
    """An MoE model's load-balancing loss reaches the gradients through megatron's
    ``MoEAuxLossAutoScaler``, whose backward multiplies it by a global scale: megatron's schedules
    set it to ``1 / num_microbatches`` (the main loss's own scale) in ``forward_step``; this
    schedule does the same. Without it the scale stays 1 (or the last value set)."""
    from verl_bridge.compat import unwrap_model

    config = getattr(unwrap_model(module), "config", None)
    if getattr(config, "num_moe_experts", None) is None:
        return
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    MoEAuxLossAutoScaler.set_loss_scale(torch.ones(1) / num_microbatches)


def _loop(forward_step_func, data_iterator, module, num_microbatches, forward_only, reduced) -> None:
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


def get_forward_backward_func(pp_size: int = 1, vp_size=None) -> Callable:
    if torch.cuda.is_available():
        from megatron.core.pipeline_parallel import get_forward_backward_func as mcore_fb

        return mcore_fb()
    if pp_size > 1:
        from verl_bridge.compat.pipeline import cpu_pipeline_schedule

        return cpu_pipeline_schedule(pp_size, vp_size)
    return cpu_forward_backward_no_pipelining
