"""Model inputs for a rollout batch: masks, positions, response slices, micro-batches.

Dynamic batching (``trainer.args.use_dynamic_bsz``): :meth:`Experience.token_micro_batches` forms
micro-batches by a token budget (``trainer.args.max_tokens_per_micro_batch``) instead of a row
count, and packs each one into a single row without padding: the real tokens of its sequences end
to end, positions restarting at 0 for each sequence, and a block-diagonal causal attention mask
(a token attends to the earlier tokens of its own sequence only). The portable spec's attention
(SDPA) and megatron's local spec take an explicit mask but not megatron's THD layout
(``PackedSeqParams`` / ``cu_seqlens``: Transformer Engine kernels), so the packed row carries a
``[1, 1, L, L]`` mask: padding costs no FLOPs in the linear layers and the MLP, attention still
scores the ``L x L`` block matrix. Per-sample tensors stay ``[B, R]``; the response outputs are
gathered back from the packed row (:func:`response_outputs`), so losses and the global token-mean
are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass
class Packed:
    """One micro-batch packed into a row: ``input_ids``, ``position_ids`` and ``segments`` ``[L]``
    (sequence index of each token), and ``index`` ``[B, R]``: the packed position whose output
    predicts each response token (positions of response padding point inside their own sequence;
    the response mask hides them)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segments: torch.Tensor
    index: torch.Tensor

    @property
    def length(self) -> int:
        return self.input_ids.shape[0]

    def inputs(self, length: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids [1, S], position_ids [1, S], attention mask [1, 1, S, S], True = masked out),
        right-padded to ``length`` (a pipeline needs one length for every micro-batch; sequence
        parallelism a multiple of TP): each padding position attends to itself only."""
        n = self.length
        length = n if length is None else length
        pad = length - n
        dev = self.input_ids.device
        ids = torch.nn.functional.pad(self.input_ids, (0, pad), value=0)
        pos = torch.nn.functional.pad(self.position_ids, (0, pad), value=0)
        seg = torch.cat([self.segments, -1 - torch.arange(pad, device=dev)])
        causal = torch.ones(length, length, dtype=torch.bool, device=dev).triu(1)
        mask = causal | (seg[:, None] != seg[None, :])
        return ids[None], pos[None], mask[None, None]


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, response_len: int) -> Packed:
    """Pack rows ``[B, S]`` (left-padded prompt + right-padded response) into one row of their real tokens."""
    keep = attention_mask.bool()
    lengths = keep.sum(dim=1)
    starts = torch.cumsum(lengths, 0) - lengths
    flat = input_ids[keep]
    segments = torch.repeat_interleave(torch.arange(input_ids.shape[0], device=input_ids.device), lengths)
    positions = torch.arange(flat.shape[0], device=input_ids.device) - starts[segments]
    # the output at original column c (a real token, or padding after the response) comes from the
    # packed position of the last real token at or before c
    rank = keep.long().cumsum(dim=1) - 1  # [B, S]: index among the row's real tokens
    cols = torch.arange(prompt_len - 1, prompt_len - 1 + response_len, device=input_ids.device)
    index = starts[:, None] + rank[:, cols].clamp(min=0)
    return Packed(flat, positions, segments, index)


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
    packed: Optional[Packed] = None  # set on micro-batches of token_micro_batches (one packed row)

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

    def token_micro_batches(self, max_tokens: int) -> list["Experience"]:
        """Micro-batches of consecutive samples (order kept) whose real tokens (prompt + response,
        padding left out) sum to at most ``max_tokens``, each packed into one row (:class:`Packed`);
        a sample longer than the budget is a micro-batch of its own."""
        lengths = self.attention_mask.sum(dim=1).tolist()
        groups: list[list[int]] = []
        held = 0
        for i, n in enumerate(lengths):
            if groups and held + n <= max_tokens:
                groups[-1].append(i)
                held += n
            else:
                groups.append([i])
                held = n
        out = []
        for g in groups:
            mb = self.select(torch.tensor(g, device=self.input_ids.device))
            mb.packed = pack(mb.input_ids, mb.attention_mask, mb.prompt_len, mb.response_ids.shape[1])
            out.append(mb)
        return out

    def split(self, micro_batch_size: int, max_tokens: Optional[int] = None) -> list["Experience"]:
        """Micro-batches: by ``max_tokens`` when given (packed), else of ``micro_batch_size`` samples."""
        return self.token_micro_batches(max_tokens) if max_tokens else self.micro_batches(micro_batch_size)


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


def response_outputs(output: torch.Tensor, mb: "Experience") -> torch.Tensor:
    """``mb``'s outputs at the positions that predict its response tokens, ``[B, R, ...]``, from a
    padded ``[B, S, ...]`` output or a packed ``[1, L, ...]`` one."""
    if mb.packed is not None:
        return output[0][mb.packed.index]
    return response_slice(output, mb.prompt_len, mb.response_ids.shape[1])
