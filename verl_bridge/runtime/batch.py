"""Model inputs for a rollout batch: masks, positions, response slices, micro-batches."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Experience:
    """One DP rank's share of a step: sequences plus everything computed on them.

    Sequence layout: ``input_ids`` [B, P + R] = left-padded prompt + right-padded response.
    Per-token tensors over the response are [B, R] and aligned with ``response_mask``.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_len: int
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    scores: torch.Tensor
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: torch.Tensor) -> "Experience":
        return Experience(
            input_ids=self.input_ids[idx],
            attention_mask=self.attention_mask[idx],
            prompt_len=self.prompt_len,
            response_ids=self.response_ids[idx],
            response_mask=self.response_mask[idx],
            scores=self.scores[idx],
            tensors={k: v[idx] for k, v in self.tensors.items()},
        )

    def micro_batches(self, micro_batch_size: int) -> list["Experience"]:
        return [self.select(torch.arange(i, min(i + micro_batch_size, self.size)))
                for i in range(0, self.size, micro_batch_size)]


def model_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, position_ids, megatron attention mask [B,1,S,S], True = masked out).

    Causal plus key padding. Padding query rows may attend to themselves so softmax never sees an
    all-masked row; their outputs are never used.
    """
    bsz, seq = input_ids.shape
    dev = input_ids.device
    positions = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    causal = torch.ones(seq, seq, dtype=torch.bool, device=dev).triu(1)
    mask = causal[None, None] | (attention_mask == 0)[:, None, None, :]
    mask = mask & ~torch.eye(seq, dtype=torch.bool, device=dev)[None, None]
    return input_ids, positions, mask


def response_slice(logits_or_values: torch.Tensor, prompt_len: int, response_len: int) -> torch.Tensor:
    """Outputs at the positions that predict response tokens: [B, S, ...] -> [B, R, ...]."""
    return logits_or_values[:, prompt_len - 1: prompt_len - 1 + response_len]
