"""Gradient finalisation between the last backward of a mini-batch and the optimizer step.

The reductions megatron-core's ``finalize_model_grads`` makes, for models that do not run under
megatron's ``DistributedDataParallel`` (the CPU path, :class:`~verl_bridge.runtime.optimizer.TorchOptimizer`).
On CUDA, :class:`~verl_bridge.runtime.optimizer.MegatronOptimizer` wraps the model in megatron's
DDP and its schedule calls megatron's own ``finalize_model_grads``; this module is not used there.

1. Data parallel: every gradient is AVERAGED over the DP group (what megatron's DDP does in its
   buckets; the loss of each rank is a share of the global loss times ``dp``, see
   :func:`verl_bridge.algorithms.core.aggregate_loss`).
2. Sequence parallel: with ``sequence_parallel`` each TP rank runs the norms on its own slice of
   the sequence, so a norm weight (replicated over TP) only gets its slice's gradient. Megatron
   tags those parameters ``param.sequence_parallel = True`` (TENorm, FusedLayerNorm); with
   ``qk_layernorm`` the q/k norms likewise see only this rank's heads. Their gradients are
   SUMMED over the TP group.
3. Tied embeddings across pipeline stages: with ``share_embeddings_and_output_weights`` and PP > 1
   the first stage holds the word embedding and the last stage a copy used as the output layer
   (megatron marks it ``shared``). The two gradients are SUMMED over megatron's embedding group
   (first and last stage), so both copies take the same step.

4. Expert parallelism (MoE): an expert parameter (megatron marks it ``allreduce = False``) lives
   on one expert-parallel rank and already holds the gradient of every token routed to it from
   the whole EP group (the token dispatcher's backward brings them home). Its gradient is SUMMED
   over the expert-data-parallel group (the ranks holding the same experts) and scaled by
   ``1 / dp_size``: megatron's DDP ``expert_gradient_scaling_factor``. Router and shared-expert
   parameters are dense (replicated over EP) and take the DP average of 1.

(Position embeddings need no reduction for a GPT: megatron's position-embedding group is the
first stage alone.)
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.distributed as dist


def _model_config(model: torch.nn.Module):
    from verl_bridge.compat import unwrap_model

    return getattr(unwrap_model(model), "config", None)


def _group_size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _allreduce_grads(grads: list[torch.Tensor], group, op=dist.ReduceOp.SUM, scale: Optional[float] = None) -> None:
    """All-reduce ``grads`` in place as one flat buffer per dtype (one collective per dtype)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for same in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in same])
        dist.all_reduce(flat, op=op, group=group)
        if scale is not None:
            flat.mul_(scale)
        offset = 0
        for g in same:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n


def sequence_parallel_params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters whose gradient megatron sums over TP: SP-tagged norms (``sequence_parallel``
    config on) and q/k layernorms (``qk_layernorm`` on). Empty when neither is configured."""
    from verl_bridge.compat import unwrap_model

    config = _model_config(model)
    sp = bool(getattr(config, "sequence_parallel", False))
    qk = bool(getattr(config, "qk_layernorm", False))
    if not (sp or qk):
        return []
    out = []
    for name, p in unwrap_model(model).named_parameters():
        if not p.requires_grad:
            continue
        if (sp and getattr(p, "sequence_parallel", False)) or (qk and ("q_layernorm" in name or "k_layernorm" in name)):
            out.append(p)
    return out


def allreduce_sequence_parallel_grads(model: torch.nn.Module, tp_group=None) -> int:
    """Sum the gradients of :func:`sequence_parallel_params` over the TP group; returns how many."""
    from megatron.core import parallel_state as mpu

    if tp_group is None:
        if not mpu.model_parallel_is_initialized():
            return 0
        tp_group = mpu.get_tensor_model_parallel_group()
    if _group_size(tp_group) <= 1:
        return 0
    grads = [p.grad for p in sequence_parallel_params(model) if p.grad is not None]
    if grads:
        _allreduce_grads(grads, tp_group)
    return len(grads)


def tied_embedding_weight(model: torch.nn.Module) -> Optional[torch.nn.Parameter]:
    """This stage's copy of the word embedding shared with the output layer, or None (untied model,
    or a stage holding neither: PP > 2 middle stages)."""
    from verl_bridge.compat import unwrap_model

    m = unwrap_model(model)
    if not getattr(m, "share_embeddings_and_output_weights", False):
        return None
    if not (getattr(m, "pre_process", False) or getattr(m, "post_process", False)):
        return None
    getter = getattr(m, "shared_embedding_or_output_weight", None)
    return getter() if getter is not None else None


def allreduce_tied_embedding_grads(model: torch.nn.Module, embd_group=None) -> bool:
    """Sum the tied word-embedding gradient over megatron's embedding group (first + last stage).

    No-op with PP = 1 (the one weight already got both gradients), for untied models, and on ranks
    outside the group. Returns whether a reduction ran on this rank.
    """
    from megatron.core import parallel_state as mpu

    if embd_group is None:
        if not mpu.model_parallel_is_initialized():
            return False
        embd_group = mpu.get_embedding_group(check_initialized=False)
    if embd_group is None or _group_size(embd_group) <= 1:
        return False
    if dist.get_rank() not in dist.get_process_group_ranks(embd_group):
        return False
    weight = tied_embedding_weight(model)
    if weight is None:
        return False
    grad = weight.grad if weight.grad is not None else torch.zeros_like(weight)
    # every member must join the collective, even one whose copy got no gradient this step
    dist.all_reduce(grad, group=embd_group)
    weight.grad = grad
    return True


def average_data_parallel_grads(params: Iterable[torch.nn.Parameter], dp_group, dp_size: int) -> None:
    """Average the gradients of ``params`` over the data-parallel group."""
    if dp_size <= 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        _allreduce_grads(grads, dp_group, scale=1.0 / dp_size)


def reduce_expert_grads(params: list[torch.nn.Parameter], dp_size: int, edp_group=None) -> None:
    """Expert parameters: SUM over the expert-data-parallel group, then scale by ``1 / dp_size``
    (megatron's DDP for ``allreduce = False`` parameters)."""
    if edp_group is None:
        from megatron.core import parallel_state as mpu

        edp_group = mpu.get_expert_data_parallel_group()
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    scale = 1.0 / dp_size if dp_size > 1 else None
    if _group_size(edp_group) > 1:
        _allreduce_grads(grads, edp_group, scale=scale)
    elif scale is not None:
        for g in grads:
            g.mul_(scale)


def finalize_grads(model: torch.nn.Module, params: Optional[list[torch.nn.Parameter]] = None, *,
                   dp_size: int, dp_group=None) -> None:
    """DP average over ``dp_group`` (of ``dp_size`` ranks), SP-norm sum over TP, tied-embedding sum over
    PP: megatron's ``finalize_model_grads`` for a model without megatron's DDP (gradients in ``param.grad``)."""
    from verl_bridge.compat.moe import is_expert_param

    params = [p for p in model.parameters() if p.requires_grad] if params is None else params
    experts = [p for p in params if is_expert_param(p)]
    if experts:
        params = [p for p in params if not is_expert_param(p)]
        reduce_expert_grads(experts, dp_size)
    if dp_size > 1:
        average_data_parallel_grads(params, dp_group, dp_size)
    allreduce_sequence_parallel_grads(model)
    allreduce_tied_embedding_grads(model)
