"""GQA decode attention in one Triton kernel: the fast decoder's attention step on CUDA.

One decode step has one query token per row. Under GQA a query group's ``r`` heads share one K/V
head, so the work per (row, group) is ``r`` query vectors against that group's cached keys and
values. ``scaled_dot_product_attention`` runs that as an ``r``-row query block (the fast decoder's
trick: no repeated K/V), but its kernels tile queries by 64 or 128 rows, and with the key mask as a
dense additive tensor; on the H100 at batch 512 the attention was 53% of the decode step's GPU time
(kernel_profile, 2026-12-07) while it reads less than half of the step's bytes.

This kernel reads each (row, group)'s K and V once, in blocks of ``BLOCK_N`` slots, with an online
softmax over the blocks (fp32 statistics), the ``r`` heads padded to 16 rows for ``tl.dot``, and the
boolean key-valid mask read directly; slots past a row's valid keys are not loaded. Rows and groups
are the grid; with few of them (small batches) the key range is also split over programs and the
partial results merged with their log-sum-exp (split-K, "flash decoding").

:func:`gqa_decode_attention` is the entry point; :func:`triton_reason` says why it cannot be used
(then the decoder keeps SDPA). Tests run the kernel under ``TRITON_INTERPRET=1`` on the CPU against
``scaled_dot_product_attention``.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

try:  # triton ships with CUDA builds of torch; CPU wheels have none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on CPU-only installs
    triton = None
    tl = None


def triton_reason(device: torch.device, head_dim: int, rep: int) -> Optional[str]:
    """``None`` when the Triton kernel can serve this decoder; otherwise why not."""
    if triton is None:
        return "triton is not installed"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"device {device.type} (the kernel runs on CUDA)"
    if head_dim < 16 or head_dim & (head_dim - 1):
        return f"head_dim={head_dim} is not a power of two >= 16"
    if rep > 64:
        return f"{rep} query heads per group (at most 64)"
    return None


if triton is not None:

    @triton.jit
    def _partial_kernel(Q, K, V, Valid, O, Lse, scale, L, G, R, per_split,
                        sqb, sqg, sqr, skb, skg, skl, svb, svg, svl, smb,
                        sob, sog, sos, sor, smb2, smg, sms,
                        R_PAD: tl.constexpr, HD: tl.constexpr, BLOCK_N: tl.constexpr):
        pid = tl.program_id(0)
        split = tl.program_id(1)
        b = pid // G
        g = pid % G
        offs_r = tl.arange(0, R_PAD)
        offs_d = tl.arange(0, HD)
        rmask = offs_r < R
        q = tl.load(Q + b * sqb + g * sqg + offs_r[:, None] * sqr + offs_d[None, :], mask=rmask[:, None], other=0.0)
        m_i = tl.full([R_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([R_PAD], tl.float32)
        acc = tl.zeros([R_PAD, HD], tl.float32)
        lo = split * per_split
        hi = tl.minimum(lo + per_split, L)
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            valid = tl.load(Valid + b * smb + offs_n, mask=offs_n < hi, other=0) != 0
            k = tl.load(K + b * skb + g * skg + offs_n[:, None] * skl + offs_d[None, :], mask=valid[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a block with no valid key yet
            alpha = tl.exp(m_i - m_ref)
            p = tl.exp(s - m_ref[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + b * svb + g * svg + offs_n[:, None] * svl + offs_d[None, :], mask=valid[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(O + b * sob + g * sog + split * sos + offs_r[:, None] * sor + offs_d[None, :], out, mask=rmask[:, None])
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log(tl.where(l_i == 0.0, 1.0, l_i)))
        tl.store(Lse + b * smb2 + g * smg + split * sms + offs_r, lse, mask=rmask)

    @triton.jit
    def _merge_kernel(Part, Lse, O, S, G, R,
                      spb, spg, sps, spr, slb, slg, sls, sob, sog, sor,
                      R_PAD: tl.constexpr, HD: tl.constexpr, S_PAD: tl.constexpr):
        pid = tl.program_id(0)
        b = pid // G
        g = pid % G
        offs_r = tl.arange(0, R_PAD)
        offs_d = tl.arange(0, HD)
        offs_s = tl.arange(0, S_PAD)
        rmask = offs_r < R
        lse = tl.load(Lse + b * slb + g * slg + offs_s[:, None] * sls + offs_r[None, :],
                      mask=(offs_s[:, None] < S) & rmask[None, :], other=float("-inf"))  # [S_PAD, R_PAD]
        m = tl.max(lse, 0)
        m = tl.where(m == float("-inf"), 0.0, m)
        w = tl.exp(lse - m[None, :])
        w = w / tl.sum(w, 0)[None, :]
        acc = tl.zeros([R_PAD, HD], tl.float32)
        for s in range(0, S):
            ws = tl.sum(tl.where(offs_s[:, None] == s, w, 0.0), 0)  # [R_PAD]
            part = tl.load(Part + b * spb + g * spg + s * sps + offs_r[:, None] * spr + offs_d[None, :],
                           mask=rmask[:, None], other=0.0)
            acc += ws[:, None] * part
        tl.store(O + b * sob + g * sog + offs_r[:, None] * sor + offs_d[None, :], acc.to(O.dtype.element_ty),
                 mask=rmask[:, None])


def _splits(rows_groups: int, length: int, block: int, device: torch.device) -> int:
    """Programs per (row, group) along the keys: enough programs for ~4 per SM, each >= 4 blocks."""
    if device.type != "cuda":
        return 1 if length <= 4 * block else 2
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = max(1, -(-4 * sms // rows_groups))
    most = max(1, length // (4 * block))
    return int(min(want, most, 16))


def gqa_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_valid: torch.Tensor,
                         scale: float, block_n: int = 64, splits: Optional[int] = None,
                         length: Optional[int] = None, num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """Attention of one decode step: q [B, G, r, hd], k/v [B, G, L, hd] (the cache, any strides with a
    contiguous last dim), key_valid [B, L] bool (True = may attend); only the first ``length`` slots
    (default ``L``) are read. Returns [B, G, r, hd] in q's dtype, equal to
    ``scaled_dot_product_attention(q, k[:, :, :length], v[:, :, :length], attn_mask=key_valid[:, None, None, :length], scale=scale)``."""
    B, G, R, HD = q.shape
    assert k.shape == v.shape and k.shape[:2] == (B, G) and k.shape[3] == HD, (q.shape, k.shape, v.shape)
    assert key_valid.shape == (B, k.shape[2]), (key_valid.shape, k.shape)
    L = k.shape[2] if length is None else int(length)
    assert 0 < L <= k.shape[2], (L, k.shape)
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1 and key_valid.stride(-1) == 1
    r_pad = max(16, 1 << (R - 1).bit_length())
    S = splits or _splits(B * G, L, block_n, q.device)
    per_split = -(-L // S)
    per_split = -(-per_split // block_n) * block_n
    S = -(-L // per_split)
    valid = key_valid.view(torch.uint8) if key_valid.dtype == torch.bool else key_valid
    part = torch.empty(B, G, S, R, HD, device=q.device, dtype=torch.float32)
    lse = torch.empty(B, G, S, R, device=q.device, dtype=torch.float32)
    _partial_kernel[(B * G, S)](
        q, k, v, valid, part, lse, float(scale), L, G, R, per_split,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), valid.stride(0),
        part.stride(0), part.stride(1), part.stride(2), part.stride(3),
        lse.stride(0), lse.stride(1), lse.stride(2),
        R_PAD=r_pad, HD=HD, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages)
    out = torch.empty(B, G, R, HD, device=q.device, dtype=q.dtype)
    _merge_kernel[(B * G,)](
        part, lse, out, S, G, R,
        part.stride(0), part.stride(1), part.stride(2), part.stride(3),
        lse.stride(0), lse.stride(1), lse.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        R_PAD=r_pad, HD=HD, S_PAD=max(2, 1 << (S - 1).bit_length()), num_warps=4)
    return out


_OP = None
_CHECKED: dict = {}


def self_check(device: torch.device, dtype: torch.dtype, groups: int, rep: int, head_dim: int) -> Optional[str]:
    """Run the kernel once on a small problem of the decoder's shape and dtype against SDPA: ``None`` when
    it compiles and agrees, else why not (a GPU whose Triton cannot build it, e.g. bf16 ``tl.dot`` before
    sm80). Once per process and shape; the decoder then keeps SDPA, saying why."""
    key = (str(device), dtype, groups, rep, head_dim)
    if key not in _CHECKED:
        try:
            g = torch.Generator(device=device).manual_seed(0)
            B, L = 2, 80
            q = torch.randn(B, groups, rep, head_dim, device=device, dtype=dtype, generator=g)
            k = torch.randn(B, groups, L, head_dim, device=device, dtype=dtype, generator=g)
            v = torch.randn(B, groups, L, head_dim, device=device, dtype=dtype, generator=g)
            valid = torch.ones(B, L, dtype=torch.bool, device=device)
            valid[0, :30] = False
            got = gqa_decode_attention(q, k, v, valid, head_dim ** -0.5, length=70)
            ref = torch.nn.functional.scaled_dot_product_attention(
                q, k[:, :, :70], v[:, :, :70], attn_mask=valid[:, None, None, :70], scale=head_dim ** -0.5)
            err = (got.float() - ref.float()).abs().max().item()
            tol = 1e-4 if dtype == torch.float32 else 3e-2
            _CHECKED[key] = None if err <= tol else f"self-check against SDPA: max |diff| {err:.3g} > {tol:g}"
        except Exception as exc:  # noqa: BLE001 - any failure to build or run the kernel means: use SDPA
            _CHECKED[key] = f"self-check failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return _CHECKED[key]


def decode_attention_op():
    """:func:`gqa_decode_attention` as a torch custom op (``verl_bridge::gqa_decode_attention``), so that
    ``torch.compile`` of the whole decode step (``rollout.compile_decode``) calls it as one opaque kernel
    pair instead of tracing into the Triton launch."""
    global _OP
    if _OP is None:
        @torch.library.custom_op("verl_bridge::gqa_decode_attention", mutates_args=())
        def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_valid: torch.Tensor, length: int,
               scale: float) -> torch.Tensor:
            return gqa_decode_attention(q, k, v, key_valid, scale, length=length)

        @op.register_fake
        def _(q, k, v, key_valid, length, scale):
            return q.new_empty(q.shape)

        _OP = op
    return _OP
