"""Log-probabilities and entropy from vocab-parallel (TP-sharded) logits.

With TP > 1 megatron's output layer returns logits sharded over the vocabulary
(``[b, s, V/tp]``). Log-probs use megatron-core's ``vocab_parallel_cross_entropy`` (differentiable,
never gathers the full vocabulary). Entropy uses :class:`_VocabParallelEntropy`:

    H = lse - sum_v p_v z_v,  lse = log sum_v exp(z_v),  dH/dz_v = -p_v (z_v - lse + H)

computed with all-reduces of the max, the sum of exponentials and ``sum p z`` across the TP group.

Megatron pads the vocabulary (``make_vocab_size_divisible_by * tp``); the samplers and the sync
check use the unpadded one (the model's ``hf_vocab_size``). :func:`mask_padded_vocab` removes the
padding columns from the logits before any softmax here, so training log-probs, entropy and the
rollout's distribution are over the same vocabulary.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _tp_group_and_size():
    from megatron.core import parallel_state as mpu

    if not mpu.model_parallel_is_initialized():
        return None, 1
    return mpu.get_tensor_model_parallel_group(), mpu.get_tensor_model_parallel_world_size()


def unpadded_vocab_size(model: torch.nn.Module):
    """The model's unpadded vocabulary (``hf_vocab_size``, set by the HF provider and the tiny preset), or None."""
    from verl_bridge.compat import unwrap_model

    return getattr(unwrap_model(model), "hf_vocab_size", None)


def mask_padded_vocab(logits: torch.Tensor, vocab_size, tp_rank=None) -> torch.Tensor:
    """Vocab-parallel ``logits`` [..., V/tp] with the columns of ids >= ``vocab_size`` (megatron's
    vocabulary padding) set to the dtype's lowest value: ``-inf`` in effect (softmax weight 0), but
    finite, so the entropy's ``p * z`` stays 0 there. ``tp_rank``: this shard's TP rank (default:
    megatron's). No-op when ``vocab_size`` is None or this shard holds no padding."""
    if vocab_size is None:
        return logits
    if tp_rank is None:
        _, size = _tp_group_and_size()
        if size > 1:
            from megatron.core import parallel_state as mpu

            tp_rank = mpu.get_tensor_model_parallel_rank()
        else:
            tp_rank = 0
    local = logits.shape[-1]
    start = tp_rank * local
    if start + local <= vocab_size:
        return logits
    padding = torch.arange(start, start + local, device=logits.device) >= vocab_size
    return logits.masked_fill(padding, torch.finfo(logits.dtype).min)


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
