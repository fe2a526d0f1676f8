"""Model inputs for a rollout batch: masks, positions, response slices, micro-batches.

Dynamic batching (``trainer.args.use_dynamic_bsz``): :meth:`Experience.token_micro_batches` forms
micro-batches by a token budget (``trainer.args.max_tokens_per_micro_batch``) instead of a row
count, and packs each one into rows no longer than the padded sequence, without padding inside:
the real tokens of its sequences end to end, positions restarting at 0 for each sequence, and a
block-diagonal causal attention mask (a token attends to the earlier tokens of its own sequence
only); only the last row's tail (and, for a pipeline, rows up to one shape) is padding. The portable spec's attention
(SDPA) and megatron's local spec take an explicit mask but not megatron's THD layout
(``PackedSeqParams`` / ``cu_seqlens``: Transformer Engine kernels), so the packed row carries a
``[K, 1, L, L]`` mask: padding costs (almost) no FLOPs in the linear layers and the MLP, and
attention scores each row's ``L x L`` block matrix, ``L`` at most the padded length. Per-sample tensors stay ``[B, R]``; the response outputs are
gathered back from the packed row (:func:`response_outputs`), so losses and the global token-mean
are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass
class Packed:
    """One micro-batch packed into rows: ``input_ids``, ``position_ids`` and ``segments`` ``[K, W]``
    (the sample index of each token; padding at the end of a row gets its own negative id), and
    ``row`` / ``col`` ``[B, R]``: the packed position whose output predicts each response token
    (positions of response padding point inside their own sequence; the response mask hides them)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segments: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def length(self) -> int:
        return self.input_ids.shape[1]

    def inputs(self, length: Optional[int] = None, rows: Optional[int] = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids [K, S], position_ids [K, S], attention mask [K, 1, S, S], True = masked out),
        padded to ``length`` columns and ``rows`` rows (a pipeline needs one shape for every
        micro-batch; sequence parallelism a length that divides by TP): each padding position
        attends to itself only."""
        k, n = self.input_ids.shape
        length = n if length is None else length
        rows = k if rows is None else rows
        pad = (0, length - n, 0, rows - k)
        ids = torch.nn.functional.pad(self.input_ids, pad, value=0)
        pos = torch.nn.functional.pad(self.position_ids, pad, value=0)
        seg = torch.nn.functional.pad(self.segments, pad, value=-1)
        dev = ids.device
        fresh = -2 - torch.arange(rows * length, device=dev).view(rows, length)  # one id per padding slot
        seg = torch.where(seg < 0, fresh, seg)
        causal = torch.ones(length, length, dtype=torch.bool, device=dev).triu(1)
        mask = causal[None] | (seg[:, :, None] != seg[:, None, :])
        return ids, pos, mask[:, None]


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, response_len: int,
         row_tokens: Optional[int] = None) -> Packed:
    """Pack rows ``[B, S]`` (left-padded prompt + right-padded response) into rows of at most
    ``row_tokens`` real tokens (default ``S``: no row is longer than a padded one, so attention
    never costs more than padded), samples in order, a new row when the next one does not fit."""
    keep = attention_mask.bool()
    dev = input_ids.device
    lengths = keep.sum(dim=1).tolist()
    cap = max(row_tokens or input_ids.shape[1], max(lengths, default=1))
    row_of, start_of, rows = [], [], [0]
    for n in lengths:
        if rows[-1] and rows[-1] + n > cap:
            rows.append(0)
        row_of.append(len(rows) - 1)
        start_of.append(rows[-1])
        rows[-1] += n
    width = max(rows)
    ids = torch.zeros(len(rows), width, dtype=input_ids.dtype, device=dev)
    pos = torch.zeros(len(rows), width, dtype=torch.long, device=dev)
    seg = torch.full((len(rows), width), -1, dtype=torch.long, device=dev)
    for i, (n, r, c) in enumerate(zip(lengths, row_of, start_of)):
        ids[r, c:c + n] = input_ids[i][keep[i]]
        pos[r, c:c + n] = torch.arange(n, device=dev)
        seg[r, c:c + n] = i
    # the output at original column c (a real token, or padding after the response) comes from the
    # packed position of the last real token at or before c
    rank = keep.long().cumsum(dim=1) - 1  # [B, S]: index among the sample's real tokens
    cols = torch.arange(prompt_len - 1, prompt_len - 1 + response_len, device=dev)
    row = torch.tensor(row_of, device=dev)[:, None].expand(-1, response_len)
    col = torch.tensor(start_of, device=dev)[:, None] + rank[:, cols].clamp(min=0)
    return Packed(ids, pos, seg, row, col)


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

    def token_micro_batches(self, max_tokens: int, row_tokens: Optional[int] = None) -> list["Experience"]:
        """Micro-batches of consecutive samples (order kept) whose real tokens (prompt + response,
        padding left out) sum to at most ``max_tokens``, each packed into rows of at most
        ``row_tokens`` tokens (default: the padded length; :func:`pack`); a sample longer than the
        budget is a micro-batch of its own."""
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
            mb.packed = pack(mb.input_ids, mb.attention_mask, mb.prompt_len, mb.response_ids.shape[1], row_tokens)
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
    padded ``[B, S, ...]`` output or a packed ``[K, L, ...]`` one."""
    if mb.packed is not None:
        return output[mb.packed.row, mb.packed.col]
    return response_slice(output, mb.prompt_len, mb.response_ids.shape[1])
