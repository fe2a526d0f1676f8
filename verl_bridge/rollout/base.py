"""The rollout protocol shared by the native and vLLM engines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    eos_token_id: Optional[int] = None
    pad_token_id: int = 0


@dataclass
class RolloutBatch:
    """Prompts left-padded to a common length, responses right-padded.

    ``prompt_ids`` [B, P], ``prompt_mask`` [B, P] (1 = real token), ``response_ids`` [B, R],
    ``response_mask`` [B, R] (1 = generated token, EOS included). ``log_probs`` [B, R] (float32):
    the engine's log-probability of each sampled token under the distribution it sampled from
    (after temperature / top-k / top-p; 0 on padding), or ``None`` when the engine gives none.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    log_probs: Optional[torch.Tensor] = None
    # [B, P + R, MoE layers, top-k] expert choices of the rollout (algorithm.moe_routing_replay), else None
    routed_experts: Optional[torch.Tensor] = None

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists -> (ids, mask) ``[B, P]``, left-padded with ``pad_id`` to the longest prompt."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long, device=device)
            mask[i, width - len(p):] = 1
    return ids, mask


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> RolloutBatch: ...

    def sync_weights(self) -> None: ...
