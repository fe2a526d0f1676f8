"""The only conversion steps that are code: fused megatron tensors.

* ``linear_qkv`` is interleaved per query group. For each group ``g`` of ``ng`` groups it holds
  ``[q heads of g (heads_per_group * head_dim rows); k_g (head_dim); v_g (head_dim)]``
  (megatron-core ``SelfAttention.get_query_key_value_tensors`` views it as
  ``[sq, b, ng, (np/ng + 2) * hn]``). Works for weights ``[rows, hidden]`` and biases ``[rows]``.
* a gated ``linear_fc1`` is ``[gate; up]`` (megatron's ``glu``: ``act(x[0]) * x[1]`` after
  ``chunk(2, -1)``); tensor parallel shard ``i`` holds ``[gate_i; up_i]``.
"""

from __future__ import annotations

import torch


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, num_groups: int) -> torch.Tensor:
    head_dim = q.shape[0] // num_heads
    rest = tuple(q.shape[1:])
    per_group = num_heads // num_groups
    qg = q.reshape(num_groups, per_group * head_dim, *rest)
    kg = k.reshape(num_groups, head_dim, *rest)
    vg = v.reshape(num_groups, head_dim, *rest)
    return torch.cat([qg, kg, vg], dim=1).reshape(-1, *rest).contiguous()


def split_qkv_grouped(qkv: torch.Tensor, num_heads: int, num_groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views (no copy) of q, k, v in their per-group layout ``[groups, rows per group, *rest]``.

    ``t.reshape(-1, *rest)`` of each is the HF tensor; that reshape copies unless there is one group.
    """
    rest = tuple(qkv.shape[1:])
    per_group = num_heads // num_groups
    head_dim = qkv.shape[0] // (num_heads + 2 * num_groups)
    g = qkv.reshape(num_groups, (per_group + 2) * head_dim, *rest)  # a view when qkv is contiguous
    q, k, v = torch.split(g, [per_group * head_dim, head_dim, head_dim], dim=1)
    return q, k, v


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.cat([gate, up], dim=0).contiguous()


def split_gate_up(fc1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gate, up = torch.chunk(fc1, 2, dim=0)
    return gate.contiguous(), up.contiguous()


FUSED_PARTS = {"linear_qkv": ("q", "k", "v"), "linear_fc1": ("gate", "up")}
