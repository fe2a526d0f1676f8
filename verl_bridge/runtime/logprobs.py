"""Log-probabilities and entropy from vocab-parallel (TP-sharded) logits.

With TP > 1 megatron's output layer returns logits sharded over the vocabulary
(``[b, s, V/tp]``). Log-probs use megatron-core's ``vocab_parallel_cross_entropy`` (differentiable,
never gathers the full vocabulary). Entropy uses :class:`_VocabParallelEntropy`:

    H = lse - sum_v p_v z_v,  lse = log sum_v exp(z_v),  dH/dz_v = -p_v (z_v - lse + H)

computed with all-reduces of the max, the sum of exponentials and ``sum p z`` across the TP group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _tp_group_and_size():
    from megatron.core import parallel_state as mpu

    if not mpu.model_parallel_is_initialized():
        return None, 1
    return mpu.get_tensor_model_parallel_group(), mpu.get_tensor_model_parallel_world_size()


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) for vocab-parallel ``logits`` [..., V/tp] and ``targets`` [...] (full-vocab ids)."""
    group, size = _tp_group_and_size()
    logits = logits.float()
    if size == 1:
        return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    # megatron subtracts the max from its input in place: give it its own contiguous copy
    return -vocab_parallel_cross_entropy(logits.contiguous().clone(), targets.contiguous())


class _VocabParallelEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, group):
        z = logits.float()
        zmax = z.max(dim=-1, keepdim=True).values
        if group is not None:
            dist.all_reduce(zmax, op=dist.ReduceOp.MAX, group=group)
        e = torch.exp(z - zmax)
        s = e.sum(dim=-1, keepdim=True)
        if group is not None:
            dist.all_reduce(s, group=group)
        lse = zmax + torch.log(s)
        p = e / s
        pz = (p * z).sum(dim=-1, keepdim=True)
        if group is not None:
            dist.all_reduce(pz, group=group)
        h = lse - pz
        ctx.save_for_backward(p, z, lse, h)
        return h.squeeze(-1)

    @staticmethod
    def backward(ctx, grad_h):
        p, z, lse, h = ctx.saved_tensors
        grad = -grad_h.unsqueeze(-1) * p * (z - lse + h)
        return grad, None


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the full vocabulary, from vocab-parallel logits [..., V/tp]."""
    group, size = _tp_group_and_size()
    return _VocabParallelEntropy.apply(logits, group if size > 1 else None)
