"""Fused temperature / top-k / top-p sampling over a batch of logits."""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """``logits / temperature`` (fp32) with everything outside top-k / top-p set to ``-inf``."""
    logits = logits.float() / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(dim=-1) - probs > top_p  # keep the smallest prefix whose mass reaches top_p
        logits = logits.scatter(-1, idx, sorted_logits.masked_fill(drop, float("-inf")))
    return logits


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, top_k: int,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Sample one token per row of ``logits`` [B, V]. ``temperature == 0`` means greedy."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(filter_logits(logits, temperature, top_p, top_k), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def sampled_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float, top_p: float,
                      top_k: int) -> torch.Tensor:
    """log-probability [B] of ``tokens`` under the distribution :func:`sample_next` draws from
    (``logits / T`` after top-k / top-p, renormalised; greedy ``T == 0``: the plain softmax)."""
    z = logits.float() if temperature == 0 else filter_logits(logits, temperature, top_p, top_k)
    return torch.log_softmax(z, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
