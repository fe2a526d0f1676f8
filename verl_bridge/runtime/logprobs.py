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


def tensor_parallel_size() -> int:
    """Megatron's TP world size (1 when model parallelism is not initialised)."""
    return _tp_group_and_size()[1]


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


# ---------------------------------------------------------------------------------------------------
# TP=1: log p(target) straight from the model's (bf16) logits, in row chunks


def _chunk_forward(x, t, inv_t: float, vocab: int):
    z = x.float()
    if inv_t != 1.0:
        z = z * inv_t
    z = z[..., :vocab]
    lse = torch.logsumexp(z, dim=-1)
    return z.gather(-1, t.unsqueeze(-1)).squeeze(-1) - lse, lse


def _chunk_backward(x, t, lse, g, inv_t: float, vocab: int):
    z = x.float()
    if inv_t != 1.0:
        z = z * inv_t
    p = torch.exp(z - lse.unsqueeze(-1))
    if vocab < z.shape[-1]:  # megatron's vocabulary padding: weight 0 in the softmax, no gradient
        p = p.masked_fill(torch.arange(z.shape[-1], device=z.device) >= vocab, 0.0)
    gs = (g * inv_t).unsqueeze(-1)
    return (-(p * gs)).scatter_add(-1, t.unsqueeze(-1), gs).to(x.dtype)


def _chunk_entropy(x, t, inv_t: float, vocab: int):
    """log p(target) and the entropy ``lse - sum_v p_v z_v`` of one chunk (no gradient: old log-probs)."""
    z = x.float()
    if inv_t != 1.0:
        z = z * inv_t
    z = z[..., :vocab]
    lse = torch.logsumexp(z, dim=-1)
    p = torch.exp(z - lse.unsqueeze(-1))
    return z.gather(-1, t.unsqueeze(-1)).squeeze(-1) - lse, lse - (p * z).sum(dim=-1)


_EAGER = (_chunk_forward, _chunk_backward, _chunk_entropy)
_COMPILED: dict = {}


def _kernels(device: torch.device):
    """The chunk functions, compiled by inductor on CUDA (one fused pass over a chunk's logits each way,
    where eager takes ~6); eager elsewhere, or where compilation fails (said once)."""
    if device.type != "cuda":
        return _EAGER
    if "fns" not in _COMPILED:
        _COMPILED["fns"] = tuple(torch.compile(f, dynamic=True) for f in _EAGER)
    return _COMPILED["fns"]


def _call(i: int, *args):
    fns = _kernels(args[0].device)
    if fns[i] is not _EAGER[i]:
        try:
            return fns[i](*args)
        except Exception as e:  # noqa: BLE001 - no working inductor here: the eager functions compute the same
            import logging

            logging.getLogger(__name__).warning("compiled log-probs failed, computing eagerly: %s",
                                                f"{type(e).__name__}: {e}"[:300])
            _COMPILED["fns"] = _EAGER
    return _EAGER[i](*args)


class _FusedTokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, targets, inv_t: float, vocab: int, rows: int):
        out = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        lse = torch.empty_like(out)
        for i in range(0, x.shape[0], rows):
            out[i:i + rows], lse[i:i + rows] = _call(0, x[i:i + rows], targets[i:i + rows], inv_t, vocab)
        ctx.save_for_backward(x, targets, lse)
        ctx.inv_t, ctx.vocab, ctx.rows = inv_t, vocab, rows
        return out

    @staticmethod
    def backward(ctx, g):
        x, targets, lse = ctx.saved_tensors
        grad = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        g = g.float()
        for i in range(0, x.shape[0], ctx.rows):
            grad[i:i + ctx.rows] = _call(1, x[i:i + ctx.rows], targets[i:i + ctx.rows], lse[i:i + ctx.rows],
                                         g[i:i + ctx.rows], ctx.inv_t, ctx.vocab)
        return grad, None, None, None, None


def fused_token_log_probs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                          vocab_size=None, chunk_bytes: int = 1 << 30) -> torch.Tensor:
    """``log_softmax(logits / T)[target]`` over the first ``vocab_size`` columns, fp32 ``[...]``, at TP=1.

    The same value and gradient as :func:`token_log_probs` on :func:`~verl_bridge.runtime.forward.
    response_logits`, without its full-size fp32 tensors: ``logits`` (any float dtype, a strided
    view such as the response slice of the model output is fine) is read in chunks of leading rows
    whose fp32 copy is at most ``chunk_bytes``; forward keeps only the ``logsumexp`` per token, and
    backward writes the gradient in the logits' dtype chunk by chunk (``(onehot - p) / T``). On a
    [16, 256, 152k] micro-batch the eager path held ~3 fp32 copies (2.5 GB each) and made ~10
    passes over them; here the peak extra memory is one chunk. ``temperature`` 0 or 1: no scaling.
    """
    V = logits.shape[-1]
    vocab = V if vocab_size is None else min(int(vocab_size), V)
    inv_t = 1.0 / temperature if temperature and temperature != 1.0 else 1.0
    per_row = max(1, logits[:1].numel() * 4)
    rows = max(1, chunk_bytes // per_row)
    return _FusedTokenLogProbs.apply(logits, targets, inv_t, vocab, rows)


@torch.no_grad()
def fused_log_probs_and_entropy(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                                vocab_size=None, chunk_bytes: int = 1 << 30) -> tuple[torch.Tensor, torch.Tensor]:
    """Without gradient (the old-policy pass): :func:`fused_token_log_probs` plus the entropy of
    ``softmax(logits / T)`` over the first ``vocab_size`` columns, both fp32 ``[...]``, computed in the
    same row chunks (what :func:`token_log_probs` and :func:`token_entropy` give on fp32 logits)."""
    V = logits.shape[-1]
    vocab = V if vocab_size is None else min(int(vocab_size), V)
    inv_t = 1.0 / temperature if temperature and temperature != 1.0 else 1.0
    rows = max(1, chunk_bytes // max(1, logits[:1].numel() * 4))
    lp = torch.empty(logits.shape[:-1], dtype=torch.float32, device=logits.device)
    ent = torch.empty_like(lp)
    for i in range(0, logits.shape[0], rows):
        lp[i:i + rows], ent[i:i + rows] = _call(2, logits[i:i + rows], targets[i:i + rows], inv_t, vocab)
    return lp, ent


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
