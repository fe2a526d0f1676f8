"""A functional, CUDA-graph decoder that reads a megatron-core ``GPTModel``'s parameters in place.

Why: megatron's module forward costs a few hundred Python-level operations per layer and token.
At decode time (one token per row) that overhead, not the GPU, sets the speed. This module runs
the *same* math on the *same* parameter tensors (no copy, so there is nothing to sync after an
optimizer step) as a short functional program with a static KV cache, and on CUDA captures one
decode step -- all layers, sampling, EOS bookkeeping -- in a CUDA graph that is replayed once per
token.

Supported models (everything else falls back to the module path in
:class:`verl_bridge.rollout.native.NativeEngine`, with :func:`unsupported_reason` saying why):
TP=1, PP=1, megatron-core ``GPTModel`` built from the local / portable spec, RMSNorm or LayerNorm
(not zero-centred), RoPE (not interleaved, full rotary dimension) or learned absolute positions,
gated (SwiGLU-style) or plain MLP, optional linear biases, GQA, tied or untied output layer.

Numerics follow megatron: the fused QKV projection is split per query group
(``[q_1..q_r, k, v]`` for each group), RoPE uses the positions of the padded sequence (RoPE is
relative, so left padding changes nothing), ``cos``/``sin`` are computed in fp32 and cast to the
activation dtype, the MLP's fused ``linear_fc1`` is ``[gate; up]``. Tests compare logits with the
module forward at every step.

Sampling is Gumbel-max (``argmax(logits / T + Gumbel noise)``), which draws from exactly
``softmax(logits / T)`` and needs no host synchronisation, so it can live inside the graph;
top-k / top-p filtering happens before it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from verl_bridge.compat import unwrap_model as unwrap
from verl_bridge.rollout.base import RolloutBatch, SamplingParams
from verl_bridge.rollout.sampling import sampled_log_probs


def unsupported_reason(model: torch.nn.Module) -> Optional[str]:
    """``None`` when :class:`FastDecoder` can run ``model``; otherwise the reason it cannot."""
    m = unwrap(model)
    if not hasattr(m, "decoder") or not hasattr(m, "embedding"):
        return "not a megatron-core GPTModel with pre- and post-processing (PP>1 stages are not supported)"
    if not getattr(m, "post_process", True) or not hasattr(m, "output_layer"):
        return "the model has no output layer on this rank"
    c = m.config
    if getattr(c, "tensor_model_parallel_size", 1) != 1:
        return f"tensor_model_parallel_size={c.tensor_model_parallel_size} (the fast decoder runs at TP=1)"
    if getattr(c, "pipeline_model_parallel_size", 1) != 1:
        return "pipeline parallelism"
    if c.normalization not in ("RMSNorm", "LayerNorm"):
        return f"normalization={c.normalization}"
    if getattr(c, "layernorm_zero_centered_gamma", False):
        return "zero-centred layer-norm gamma"
    if getattr(c, "qk_layernorm", False) or getattr(c, "multi_latent_attention", False):
        return "q/k layer norm or multi-latent attention"
    if getattr(c, "num_moe_experts", None):
        return "mixture of experts"
    pe = getattr(m, "position_embedding_type", "rope")
    if pe not in ("rope", "learned_absolute"):
        return f"position_embedding_type={pe}"
    if pe == "rope":
        rope = m.rotary_pos_emb
        if getattr(rope, "rotary_interleaved", False) or getattr(c, "rotary_interleaved", False):
            return "interleaved RoPE"
        if rope.inv_freq.numel() * 2 != c.kv_channels:
            return "partial rotary dimension"
        if getattr(rope, "seq_len_interpolation_factor", None):
            return "RoPE sequence-length interpolation"
    layer = m.decoder.layers[0]
    for name in ("input_layernorm", "pre_mlp_layernorm"):
        if not hasattr(getattr(layer, name, None), "weight"):
            return f"layer norm fused into the linear layers ({name} is not a separate norm: Transformer Engine spec)"
    if c.apply_residual_connection_post_layernorm:
        return "apply_residual_connection_post_layernorm"
    if getattr(c, "activation_func_clamp_value", None) is not None or getattr(c, "glu_linear_offset", 0.0):
        return "clamped or offset GLU activation"
    return mixed_dtype_reason(m)


def mixed_dtype_reason(model: torch.nn.Module) -> Optional[str]:
    """Why a model whose floating parameters do not share one dtype cannot run here, else ``None``.

    The decoder feeds each op's output straight into the next weight (``F.linear(h, W)``), so a
    bf16 linear after an fp32 LayerNorm would fail with ``mat1 and mat2 must have the same dtype``.
    Megatron-LM never runs such a model: ``get_model()``'s ``Float16Module`` casts all of it.
    """
    from verl_bridge.common.precision import parameter_dtypes

    groups = parameter_dtypes(model)
    if len(groups) <= 1:
        return None
    main = max(groups, key=lambda d: len(groups[d]))
    others = "; ".join(f"{str(d).replace('torch.', '')}: {', '.join(n[:3])}{' ...' if len(n) > 3 else ''} "
                       f"({len(n)} in all)" for d, n in groups.items() if d != main for n in [groups[d]])
    return (f"mixed parameter dtypes: most are {str(main).replace('torch.', '')}, but {others}. Cast the whole "
            "model as Megatron-LM's get_model() does with Float16Module (MegatronBridge does this for a "
            "bf16/fp16 TransformerConfig), or set rollout.decode: module")


def _norm(x, weight, bias, kind: str, eps: float):
    # the local spec's norms are torch.nn.RMSNorm / LayerNorm: the same functional kernels
    if kind == "RMSNorm":
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def _rotate_half(x):
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@dataclass
class _Layer:
    ln1_w: torch.Tensor
    ln1_b: Optional[torch.Tensor]
    qkv_w: torch.Tensor
    qkv_b: Optional[torch.Tensor]
    proj_w: torch.Tensor
    proj_b: Optional[torch.Tensor]
    ln2_w: torch.Tensor
    ln2_b: Optional[torch.Tensor]
    fc1_w: torch.Tensor
    fc1_b: Optional[torch.Tensor]
    fc2_w: torch.Tensor
    fc2_b: Optional[torch.Tensor]


class FastDecoder:
    """Prefill + static-KV-cache decode on a GPTModel's live parameters; CUDA graphs on GPU."""

    def __init__(self, model: torch.nn.Module, attention: str = "auto"):
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(f"FastDecoder cannot run this model: {reason}")
        if attention not in ("auto", "triton", "sdpa"):
            raise ValueError(f"FastDecoder: attention={attention!r}; auto, triton or sdpa")
        self.model = unwrap(model)
        c = self.model.config
        self.kind = c.normalization
        self.eps = c.layernorm_epsilon
        self.num_heads = c.num_attention_heads
        self.num_groups = c.num_query_groups or c.num_attention_heads
        self.head_dim = c.kv_channels
        self.rep = self.num_heads // self.num_groups
        self.scale = c.softmax_scale if getattr(c, "softmax_scale", None) else self.head_dim ** -0.5
        self.gated = c.gated_linear_unit
        self.act = c.activation_func
        if getattr(c, "bias_activation_fusion", False) and self.act is F.gelu:
            # megatron's fused bias-GeLU / GeGLU kernels (Megatron-LM's default --bias-gelu-fusion) use
            # GeLU's tanh approximation, not the erf form that config.activation_func names
            self.act = _gelu_tanh
        self.rope = getattr(self.model, "position_embedding_type", "rope") == "rope"
        if self.rope:  # megatron keeps inv_freq as a plain attribute: it stays on CPU after .to("cuda")
            dev = self._output_weight().device
            self.inv_freq = self.model.rotary_pos_emb.inv_freq.float().to(dev)
            half = self.inv_freq.numel()
            self.rot_sign = torch.cat([-torch.ones(half, device=dev), torch.ones(half, device=dev)])
        # decode-step attention: the Triton GQA kernel (rollout/decode_attention.py) on CUDA where it can
        # run, else SDPA; VERL_BRIDGE_DECODE_ATTENTION=sdpa turns the kernel off
        from verl_bridge.rollout.decode_attention import self_check, triton_reason

        w = self._output_weight()
        self.attention_reason = triton_reason(w.device, self.head_dim, self.rep)
        if attention == "auto" and os.environ.get("VERL_BRIDGE_DECODE_ATTENTION", "").lower() == "sdpa":
            self.attention_reason = "VERL_BRIDGE_DECODE_ATTENTION=sdpa"
        if self.attention_reason is None and attention != "sdpa":
            self.attention_reason = self_check(w.device, w.dtype, self.num_groups, self.rep, self.head_dim)
        if attention == "triton" and self.attention_reason:
            raise ValueError(f"FastDecoder: the Triton decode attention cannot run here: {self.attention_reason}")
        self.attention = "sdpa" if attention == "sdpa" or self.attention_reason else "triton"

    # ------------------------------------------------------------------ weights (views, no copies)
    def _layers(self) -> list[_Layer]:
        out = []
        for layer in self.model.decoder.layers:
            att, mlp = layer.self_attention, layer.mlp
            out.append(_Layer(
                layer.input_layernorm.weight, getattr(layer.input_layernorm, "bias", None),
                att.linear_qkv.weight, att.linear_qkv.bias, att.linear_proj.weight, att.linear_proj.bias,
                layer.pre_mlp_layernorm.weight, getattr(layer.pre_mlp_layernorm, "bias", None),
                mlp.linear_fc1.weight, mlp.linear_fc1.bias, mlp.linear_fc2.weight, mlp.linear_fc2.bias,
            ))
        return out

    def _output_weight(self) -> torch.Tensor:
        m = self.model
        if m.share_embeddings_and_output_weights:
            return m.shared_embedding_or_output_weight()
        return m.output_layer.weight

    def _fingerprint(self) -> tuple:
        return tuple(p.data_ptr() for p in self.model.parameters())

    # ------------------------------------------------------------------ math
    def _embed(self, ids, abs_pos):
        emb = self.model.embedding
        x = F.embedding(ids, emb.word_embeddings.weight)
        if not self.rope:
            x = x + F.embedding(abs_pos, emb.position_embeddings.weight)
        return x

    def _cos_sin(self, rope_pos, dtype):
        freqs = rope_pos.float()[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def _qkv(self, L: _Layer, h, cos, sin):
        """h [B, S, D] -> q [B, G, S, r, hd], k/v [B, G, S, hd] (RoPE applied)."""
        B, S, _ = h.shape
        qkv = F.linear(h, L.qkv_w, L.qkv_b).view(B, S, self.num_groups, (self.rep + 2) * self.head_dim)
        hd = self.head_dim
        q = qkv[..., : self.rep * hd].reshape(B, S, self.num_groups, self.rep, hd)
        k = qkv[..., self.rep * hd: (self.rep + 1) * hd]
        v = qkv[..., (self.rep + 1) * hd:]
        if cos is not None:
            c, s = cos[:, :, None, :], sin[:, :, None, :]  # [B, S, 1, hd]
            q = q * c[..., None, :] + _rotate_half(q) * s[..., None, :]
            k = k * c + _rotate_half(k) * s
        return q.permute(0, 2, 1, 3, 4), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)

    def _mlp(self, L: _Layer, x):
        h = _norm(x, L.ln2_w, L.ln2_b, self.kind, self.eps)
        h = F.linear(h, L.fc1_w, L.fc1_b)
        if self.gated:
            g, u = torch.chunk(h, 2, dim=-1)
            h = self.act(g) * u  # noqa: the activation is the config's (SiLU for SwiGLU)
        else:
            h = self.act(h)
        return x + F.linear(h, L.fc2_w, L.fc2_b)

    def _logits(self, x):
        m = self.model
        fl = m.decoder.final_layernorm
        x = _norm(x, fl.weight, getattr(fl, "bias", None), self.kind, self.eps)
        w = self._output_weight()
        vocab = getattr(m, "hf_vocab_size", None)
        if vocab is not None and vocab < w.shape[0]:
            w = w[:vocab]  # megatron's vocabulary padding rows are never sampled
        return F.linear(x, w).float()

    def forward_prefill(self, ids, attend, abs_pos, cache_k, cache_v, last_only: bool = False):
        """Full forward over the prompt; fills ``cache_[kv][l][:, :, :S]``; returns logits [B, S, V],
        or [B, 1, V] of the last position with ``last_only`` (generation: the full fp32 logits of a
        512 x 128 prompt batch over a 152k vocabulary are 37 GiB, more than the KV cache itself).

        ``attend`` [B, S, S] bool (True = may attend).
        """
        B, S = ids.shape
        x = self._embed(ids, abs_pos)
        cos = sin = None
        if self.rope:
            cos, sin = self._cos_sin(torch.arange(S, device=ids.device).expand(B, S), x.dtype)
        mask = attend[:, None]
        for i, L in enumerate(self._layers()):
            h = _norm(x, L.ln1_w, L.ln1_b, self.kind, self.eps)
            q, k, v = self._qkv(L, h, cos, sin)
            cache_k[i][:, :, :S] = k
            cache_v[i][:, :, :S] = v
            qh = q.permute(0, 1, 3, 2, 4).reshape(B, self.num_heads, S, self.head_dim)
            kh = k.repeat_interleave(self.rep, dim=1)
            vh = v.repeat_interleave(self.rep, dim=1)
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=self.scale)
            o = o.permute(0, 2, 1, 3).reshape(B, S, self.num_heads * self.head_dim)
            x = x + F.linear(o, L.proj_w, L.proj_b)
            x = self._mlp(L, x)
        return self._logits(x[:, -1:] if last_only else x)

    def forward_decode(self, tok, abs_pos, write_idx, key_valid, cache_k, cache_v, length: Optional[int] = None):
        """One token per row at cache slot ``write_idx`` (0-dim long tensor); returns logits [B, V].
        Attends over the first ``length`` cache slots (default: all); ``key_valid`` [B, L] and the caches
        [B, G, L, hd] are the whole buffers (the Triton kernel takes them whole with ``length``: a
        slice would be a non-contiguous view that inductor copies before a custom op, the whole KV cache
        per step).

        Kept to few kernels per layer (what a CUDA graph replays): one fused norm, the QKV GEMM,
        RoPE on q and k together, two cache writes, one attention call (the Triton GQA kernel of
        :mod:`verl_bridge.rollout.decode_attention`, or SDPA in which a group's ``r`` query heads play
        the role of ``r`` query positions against that group's keys: GQA without repeating K/V), the
        output GEMM, and the MLP.
        """
        B = tok.shape[0]
        n = key_valid.shape[1] if length is None else length
        G, r, hd = self.num_groups, self.rep, self.head_dim
        x = self._embed(tok[:, None], abs_pos[:, None])
        cos = sin = None
        if self.rope:
            # rotate_half(t) * sin == roll(t, hd/2) * (sign * sin): one roll instead of chunk/neg/cat
            cos, sin = self._cos_sin(write_idx.expand(B), x.dtype)  # [B, hd]
            sin = sin * self.rot_sign.to(sin.dtype)
            cos, sin = cos[:, None, None, :], sin[:, None, None, :]
        if self.attention == "triton":
            from verl_bridge.rollout.decode_attention import decode_attention_op

            attend = decode_attention_op()
        else:  # additive mask built once per step in the activation dtype (no per-layer bool conversion)
            mask = torch.zeros((B, n), dtype=x.dtype, device=x.device).masked_fill(
                ~key_valid[:, :n], float("-inf"))[:, None, None, :]  # [B, 1, 1, n]
        idx = write_idx.view(1)
        half = hd // 2
        for i, L in enumerate(self._layers()):
            h = _norm(x, L.ln1_w, L.ln1_b, self.kind, self.eps)
            qkv = F.linear(h, L.qkv_w, L.qkv_b).view(B, G, r + 2, hd)
            qk = qkv[:, :, : r + 1]
            if cos is not None:
                qk = torch.addcmul(qk * cos, torch.roll(qk, half, dims=-1), sin)
            cache_k[i].index_copy_(2, idx, qk[:, :, r:])
            cache_v[i].index_copy_(2, idx, qkv[:, :, r + 1:])
            if self.attention == "triton":
                o = attend(qk[:, :, :r], cache_k[i], cache_v[i], key_valid, n, self.scale)
            else:
                o = F.scaled_dot_product_attention(qk[:, :, :r], cache_k[i][:, :, :n], cache_v[i][:, :, :n],
                                                   attn_mask=mask, scale=self.scale)
            x = x + F.linear(o.reshape(B, 1, G * r * hd), L.proj_w, L.proj_b)
            x = self._mlp(L, x)
        return self._logits(x)[:, 0]

    def decode_and_sample(self, tok, abs_pos, write_idx, key_valid, cache_k, cache_v, length: int, done,
                          temperature: float, top_p: float, top_k: int, pad_token_id: int):
        """One whole decode step (all layers, then the draw of :func:`sample_step`): what
        ``compile_decode`` compiles as one graph, so the logits' fp32 cast fuses into the draw."""
        logits = self.forward_decode(tok, abs_pos, write_idx, key_valid, cache_k, cache_v, length)
        return sample_step(logits, done, temperature, top_p, top_k, pad_token_id)


    @torch.no_grad()
    def teacher_forced_logits(self, ids: torch.Tensor, decode_steps: int) -> torch.Tensor:
        """Logits [B, S, V] of unpadded ``ids`` through the generation path: prefill of the first
        ``S - decode_steps`` tokens, then single-token decode steps fed the batch's own tokens."""
        B, S = ids.shape
        plen = S - decode_steps
        dev = ids.device
        st = _State(self, B, plen, decode_steps, dev, self._output_weight().dtype)
        pos = torch.arange(S, device=dev).expand(B, S)
        attend = torch.ones(plen, plen, dtype=torch.bool, device=dev).tril().expand(B, plen, plen)
        chunks = [self.forward_prefill(ids[:, :plen], attend, pos[:, :plen], st.cache_k, st.cache_v)]
        st.key_valid[:, :plen] = True
        for t in range(decode_steps):
            st.key_valid[:, plen + t] = True
            idx = torch.tensor(plen + t, device=dev)
            step = self.forward_decode(ids[:, plen + t], pos[:, plen + t], idx, st.key_valid, st.cache_k, st.cache_v)
            chunks.append(step[:, None])
        return torch.cat(chunks, dim=1)


def gumbel_sample(logits: torch.Tensor, temperature: float, top_p: float, top_k: int,
                  generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Draw from softmax(logits / T) after top-k / top-p filtering, without a host sync."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    from verl_bridge.rollout.sampling import filter_logits

    logits = filter_logits(logits, temperature, top_p, top_k)
    u = torch.rand(logits.shape, device=logits.device, generator=generator).clamp_(min=1e-10)
    return (logits - torch.log(-torch.log(u))).argmax(dim=-1)


def sample_step(logits: torch.Tensor, done: torch.Tensor, temperature: float, top_p: float, top_k: int,
                pad_token_id: int, generator: Optional[torch.Generator] = None):
    """One decode step's tokens [B] and their log-probs [B] under the distribution sampled from
    (``softmax(logits / T)`` after top-k / top-p, renormalised; greedy ``T == 0``: the plain softmax).
    Rows already ``done`` get ``pad_token_id`` and log-prob 0.

    Without filtering (the RL default: top-k 0, top-p 1) the log-prob is ``z[tok] - logsumexp(z)``:
    two row reductions over the vocabulary and no ``[B, V]`` intermediate, which is what lets
    ``torch.compile`` fuse the whole draw into a couple of passes over the logits (eager, the draw
    and a full log-softmax were ~10 passes over a ``[B, 152k]`` fp32 tensor: a third of a decode
    step at batch 512).
    """
    filtered = temperature != 0 and ((top_k and top_k < logits.shape[-1]) or top_p < 1.0)
    if filtered:
        tok = gumbel_sample(logits, temperature, top_p, top_k, generator=generator)
        lp = sampled_log_probs(logits, tok, temperature, top_p, top_k)
    else:
        z = logits.float()
        if temperature not in (0, 1):
            z = z / temperature
        if temperature == 0:
            tok = z.argmax(dim=-1)
        else:
            u = torch.rand(z.shape, device=z.device, generator=generator).clamp_(min=1e-10)
            tok = (z - torch.log(-torch.log(u))).argmax(dim=-1)
        lp = z.gather(-1, tok[:, None])[:, 0] - torch.logsumexp(z, dim=-1)
    tok = torch.where(done, torch.full_like(tok, pad_token_id), tok)
    lp = torch.where(done, torch.zeros_like(lp), lp)
    return tok, lp


def attended_lengths(P: int, L: int, buckets: int = 4, align: int = 64) -> list[int]:
    """The cache lengths decode steps attend over, for prompt width ``P`` and cache length ``L``.

    A decode step at cache slot ``w`` needs keys ``[0, w]`` only; attending over the whole cache
    (``L`` slots, most of them still empty and masked) reads up to twice the KV bytes that the step
    needs over a long generation. The steps are therefore split into at most ``buckets`` ranges of
    cache length, each a multiple of ``align`` (the last is ``L``), and each range runs (and, on
    CUDA, is captured as a graph) over ``cache[..., :length]``. Masked slots contribute exactly zero
    to the softmax, so the tokens sampled do not depend on the bucketing. A few buckets keep the
    number of captured graphs (and of ``torch.compile`` specialisations) small; four cut the KV
    bytes read over a long generation to about 5/8 of the whole-cache reads.
    """
    first = P + 1  # the first decode step attends over the prompt and its own slot
    if L - first < align:
        return [L]
    step = -(-(L - first + 1) // buckets)
    step = -(-step // align) * align
    out = sorted({min(L, -(-(first - 1 + k * step) // align) * align) for k in range(1, buckets + 1)} | {L})
    return out


class _State:
    """Static buffers of one (batch, prompt width, new tokens) shape: what a CUDA graph reads and writes."""

    def __init__(self, dec: FastDecoder, B: int, P: int, R: int, device, dtype):
        L = P + R
        G, hd = dec.num_groups, dec.head_dim
        n = len(dec.model.decoder.layers)
        self.cache_k = [torch.zeros(B, G, L, hd, device=device, dtype=dtype) for _ in range(n)]
        self.cache_v = [torch.zeros(B, G, L, hd, device=device, dtype=dtype) for _ in range(n)]
        self.key_valid = torch.zeros(B, L, dtype=torch.bool, device=device)
        self.tok = torch.zeros(B, dtype=torch.long, device=device)
        self.abs_pos = torch.zeros(B, dtype=torch.long, device=device)
        self.write_idx = torch.zeros((), dtype=torch.long, device=device)
        self.t = torch.zeros((), dtype=torch.long, device=device)
        self.done = torch.zeros(B, dtype=torch.bool, device=device)
        self.response = torch.zeros(B, R, dtype=torch.long, device=device)
        self.resp_mask = torch.zeros(B, R, dtype=torch.long, device=device)
        self.resp_lp = torch.zeros(B, R, dtype=torch.float32, device=device)
        self.graphs: dict[int, "torch.cuda.CUDAGraph"] = {}  # one per attended cache length (see lengths)
        self.lengths = attended_lengths(P, L)
        self.batch = B
        self.views: dict[int, "_State"] = {}  # compacted states over this one's first rows (view())

    def view(self, rows: int) -> "_State":
        """A state over the first ``rows`` rows of this one's buffers (the same memory, no copy), with
        graphs of its own: what generation continues in once enough rows have finished."""
        v = self.views.get(rows)
        if v is None:
            v = object.__new__(_State)
            v.cache_k = [c[:rows] for c in self.cache_k]
            v.cache_v = [c[:rows] for c in self.cache_v]
            for name in ("key_valid", "tok", "abs_pos", "done", "response", "resp_mask", "resp_lp"):
                setattr(v, name, getattr(self, name)[:rows])
            v.write_idx, v.t = self.write_idx, self.t  # shared scalars
            v.graphs, v.lengths, v.batch, v.views = {}, self.lengths, rows, {}
            self.views[rows] = v
        return v

    def per_row(self) -> list[torch.Tensor]:
        """Every buffer with one row per sequence (what compaction gathers)."""
        return [*self.cache_k, *self.cache_v, self.key_valid, self.tok, self.abs_pos, self.done,
                self.response, self.resp_mask, self.resp_lp]

    def step_buffers(self) -> tuple[torch.Tensor, ...]:
        """What one decode step mutates outside the KV cache (saved/restored around capture)."""
        return (self.tok, self.abs_pos, self.write_idx, self.t, self.done, self.key_valid,
                self.response, self.resp_mask, self.resp_lp)


class FastEngine:
    """:class:`~verl_bridge.rollout.base.RolloutEngine` on :class:`FastDecoder` (TP=1 only).

    Prompt widths are rounded up to a multiple of ``pad_to`` (extra left padding, masked) so that
    steps with slightly different prompt lengths reuse one captured graph.
    """

    def __init__(self, model: torch.nn.Module, device: torch.device, use_cuda_graphs: Optional[bool] = None,
                 pad_to: int = 16, compile: bool = False, compile_sampler: Optional[bool] = None,
                 memory_fraction: Optional[float] = None, kv_budget_bytes: Optional[int] = None,
                 attention: str = "auto"):
        self.decoder = FastDecoder(model, attention=attention)
        # the memory plan (rows_per_pass): a batch whose KV cache and step buffers do not fit the budget
        # is generated in equal passes that do. Budget: kv_budget_bytes, else memory_fraction
        # (rollout.gpu_memory_utilization) of the device memory free when a shape is first generated
        self.memory_fraction = memory_fraction
        self.kv_budget_bytes = kv_budget_bytes
        self._plans: dict = {}
        self.device = device
        self.graphs = device.type == "cuda" if use_cuda_graphs is None else use_cuda_graphs
        # compile=True: inductor fuses the whole step (layers and the draw) before the graph is captured.
        # Otherwise, on the CUDA-graph path, only the draw (sample_step) is compiled by default: its
        # shapes are [B, V] whatever the prompt width, so it compiles once per batch size (seconds),
        # and it turns ~10 passes over the fp32 logits into two. TORCHDYNAMO_DISABLE=1 turns both off.
        if compile_sampler is None:
            compile_sampler = self.graphs and device.type == "cuda"
        if compile or compile_sampler:
            # one specialisation per (batch shape, attended length): raise dynamo's per-function cache
            # limit so that a few buckets and batch shapes never fall back to eager silently
            import torch._dynamo.config as dynamo_config

            for knob in ("cache_size_limit", "recompile_limit"):
                if hasattr(dynamo_config, knob):
                    setattr(dynamo_config, knob, max(getattr(dynamo_config, knob), 64))
        self.compiled = compile
        self._whole_step = torch.compile(self.decoder.decode_and_sample, dynamic=False) if compile else None
        self._sampler = torch.compile(sample_step, dynamic=False) if (compile or compile_sampler) else None
        self.sampler_fallback: Optional[str] = None  # why the compiled draw was given up, if it was
        self.pad_to = pad_to
        # finished rows stop costing compute: every check_every steps (one host sync, which the EOS
        # check already made) the live rows are gathered into the first rows of the state and the
        # step continues on a batch of half, a quarter, ... the size (never under min_rows), with
        # graphs of its own. Off under compile: each new batch size would compile the step again.
        self.check_every = 16
        self.compact = not compile
        self.min_rows = 8
        self.last_stats: dict = {}
        self.max_states = 4  # shapes (batch, prompt width, ...) whose KV cache and graphs are kept
        self._states: dict = {}
        self._fp = None

    def sync_weights(self) -> None:  # parameters are read in place
        return None

    def _step(self, st: _State, params: SamplingParams, gen, length: int):
        """One decode step attending over the first ``length`` cache slots (see :func:`attended_lengths`)."""
        st.key_valid.index_fill_(1, st.write_idx.view(1), True)
        args = (st.tok, st.abs_pos, st.write_idx, st.key_valid, st.cache_k, st.cache_v, length)
        if self._whole_step is not None and gen is None:
            tok, lp = self._whole_step(*args, st.done, params.temperature, params.top_p,
                                       params.top_k, params.pad_token_id)
            self._record(st, tok, lp, params)
        else:
            self._emit(st, self.decoder.forward_decode(*args), params, gen)

    def _draw(self, logits, done, params: SamplingParams, gen):
        if self._sampler is not None and gen is None and self.sampler_fallback is None:
            try:
                return self._sampler(logits, done, params.temperature, params.top_p, params.top_k, params.pad_token_id)
            except Exception as e:  # noqa: BLE001 - no working compiler toolchain: draw eagerly, say so once
                self.sampler_fallback = f"{type(e).__name__}: {e}"[:300]
                import logging

                logging.getLogger(__name__).warning("compiled sampling failed, sampling eagerly: %s",
                                                    self.sampler_fallback)
        return sample_step(logits, done, params.temperature, params.top_p, params.top_k, params.pad_token_id,
                           generator=gen)

    def _emit(self, st: _State, logits, params: SamplingParams, gen):
        tok, lp = self._draw(logits, st.done, params, gen)
        self._record(st, tok, lp, params)

    def _record(self, st: _State, tok, lp, params: SamplingParams):
        t = st.t.view(1)
        st.response.index_copy_(1, t, tok[:, None])
        st.resp_mask.index_copy_(1, t, (~st.done).long()[:, None])
        st.resp_lp.index_copy_(1, t, lp[:, None])
        if params.eos_token_id is not None:
            st.done |= tok == params.eos_token_id
        st.tok.copy_(tok)
        st.abs_pos += 1
        st.write_idx += 1
        st.t += 1

    def row_bytes(self, P: int, R: int) -> int:
        """Device bytes one row of a (prompt width ``P``, ``R`` new tokens) batch holds while generating:
        its KV cache (every layer, K and V, ``P + R`` slots) plus the step's fp32 logits and the draw's
        temporaries over the vocabulary (3 x V x 4) and its prefill activations (P x 3 x FFN)."""
        dec = self.decoder
        c = dec.model.config
        isz = dec._output_weight().element_size()
        kv = 2 * len(dec.model.decoder.layers) * dec.num_groups * (P + R) * dec.head_dim * isz
        vocab = dec._output_weight().shape[0]
        return kv + 3 * vocab * 4 + P * 3 * (c.ffn_hidden_size or 4 * c.hidden_size) * isz

    def rows_per_pass(self, B: int, P: int, R: int) -> int:
        """How many of ``B`` rows one pass generates (all of them unless the budget says otherwise)."""
        key = (B, P, R)
        if key in self._plans:
            return self._plans[key]
        budget = self.kv_budget_bytes
        if budget is None and self.memory_fraction is not None and self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
            budget = int(self.memory_fraction * (free + cached))
        rows = B if budget is None else max(1, min(B, budget // self.row_bytes(P, R)))
        if rows < B:  # the fewest passes that fit, of equal size (one captured state serves them all)
            rows = -(-B // -(-B // rows))
        self._plans[key] = rows
        return rows

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> RolloutBatch:
        width = max(len(p) for p in prompts)
        width = -(-width // self.pad_to) * self.pad_to
        B = len(prompts)
        rows = self.rows_per_pass(B, width, params.max_new_tokens)
        if rows >= B:
            return self._generate(prompts, params, seed, width)
        # the batch's KV cache does not fit the budget: equal passes of ``rows`` prompts (the last one
        # filled up with copies of its last prompt, whose outputs are dropped), each with its own seed
        parts = []
        for k, start in enumerate(range(0, B, rows)):
            chunk = prompts[start:start + rows]
            n = len(chunk)
            chunk = chunk + [chunk[-1]] * (rows - n)
            out = self._generate(chunk, params, seed if k == 0 else (seed * 1_000_003 + k) % (2 ** 63), width)
            parts.append((out, n))
        self.last_stats = {**self.last_stats, "passes": len(parts), "rows_per_pass": rows}

        def cat(name):
            return torch.cat([getattr(o, name)[:n] for o, n in parts])

        return RolloutBatch(cat("prompt_ids"), cat("prompt_mask"), cat("response_ids"), cat("response_mask"),
                            log_probs=cat("log_probs"))

    def _generate(self, prompts: list[list[int]], params: SamplingParams, seed: int, width: int) -> RolloutBatch:
        from verl_bridge.rollout.base import left_pad

        dec = self.decoder
        model = dec.model
        was_training = model.training
        model.eval()
        dev = self.device
        prompt_ids, prompt_mask = left_pad(prompts, params.pad_token_id, dev)
        if prompt_ids.shape[1] < width:
            extra = width - prompt_ids.shape[1]
            prompt_ids = F.pad(prompt_ids, (extra, 0), value=params.pad_token_id)
            prompt_mask = F.pad(prompt_mask, (extra, 0), value=0)
        B, P = prompt_ids.shape
        R = params.max_new_tokens
        dtype = dec._output_weight().dtype
        fp = dec._fingerprint()
        if fp != self._fp:  # parameters were re-allocated: captured graphs point at old memory
            self._states.clear()
            self._fp = fp
        key = (B, P, R, params.temperature, params.top_p, params.top_k, params.eos_token_id, params.pad_token_id)
        st = self._states.pop(key, None)
        if st is None:
            while len(self._states) >= self.max_states:  # the least recently used shape gives its memory back
                self._states.pop(next(iter(self._states)))
            st = _State(dec, B, P, R, dev, dtype)
        self._states[key] = st  # most recently used last
        use_graph = self.graphs and dev.type == "cuda"
        if use_graph:
            torch.cuda.manual_seed(seed)
            gen = None
        else:
            gen = torch.Generator(device=dev)
            gen.manual_seed(seed)

        # prefill (eager): causal + key padding, pad rows attend to themselves
        valid = prompt_mask.bool()
        causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        attend = (causal[None] & valid[:, None, :]) | torch.eye(P, dtype=torch.bool, device=dev)[None]
        abs_prefill = (prompt_mask.cumsum(dim=1) - 1).clamp(min=0)
        logits = dec.forward_prefill(prompt_ids, attend, abs_prefill, st.cache_k, st.cache_v, last_only=True)[:, -1]
        st.key_valid.zero_()
        st.key_valid[:, :P] = valid
        st.abs_pos.copy_(abs_prefill[:, -1])
        st.write_idx.fill_(P - 1)  # _emit advances it to P, the first decode slot
        st.t.zero_()
        st.done.zero_()
        st.response.fill_(params.pad_token_id)
        st.resp_mask.zero_()
        st.resp_lp.zero_()
        self._emit(st, logits, params, gen)

        steps = R - 1
        cur, rows = st, None  # the state decoding now, and its rows' indices in the batch (None: all, in order)
        final = None  # the batch's response / mask / log-probs once some rows were compacted away
        row_steps = 0
        bucket = 0
        for i in range(steps):
            # decode step i writes cache slot P + i and attends over slots [0, P + i]
            while st.lengths[bucket] < P + i + 1:
                bucket += 1
            length = st.lengths[bucket]
            if use_graph:
                self._graph(cur, params, gen, length).replay()
            else:
                self._step(cur, params, gen, length)
            row_steps += cur.batch
            if params.eos_token_id is not None and (i + 1) % self.check_every == 0 and i + 1 < steps:
                live = int((~cur.done).sum())  # the one host sync of the EOS check
                if live == 0:
                    break
                target = self._compact_size(cur.batch, live)
                if target < cur.batch:
                    if final is None:
                        final = (st.response.clone(), st.resp_mask.clone(), st.resp_lp.clone())
                    cur, rows = self._compact(st, cur, rows, target, final)
        self.last_stats = {"row_steps": row_steps, "row_steps_uncompacted": B * steps, "final_batch": cur.batch}
        if final is not None:  # the rows still in the compacted state hold their latest outputs
            idx = rows
            final[0][idx], final[1][idx], final[2][idx] = cur.response, cur.resp_mask, cur.resp_lp
            response, resp_mask, resp_lp = final
        else:
            response, resp_mask, resp_lp = st.response.clone(), st.resp_mask.clone(), st.resp_lp.clone()
        if was_training:
            model.train()
        return RolloutBatch(prompt_ids, prompt_mask, response, resp_mask, log_probs=resp_lp)

    def _compact_size(self, batch: int, live: int) -> int:
        """The smallest of batch/2, batch/4, ... (not under ``min_rows``) that holds ``live`` rows; else ``batch``."""
        if not self.compact:
            return batch
        size = batch
        while size % 2 == 0 and size // 2 >= max(live, self.min_rows):
            size //= 2
        return size

    def _compact(self, root: _State, cur: _State, rows, target: int, final):
        """Gather ``cur``'s live rows (then finished ones, to fill ``target``) into the first ``target``
        rows of ``root``'s buffers; returns that view state and the batch indices of its rows. The
        outputs of every row of ``cur`` are saved in ``final`` first (the rows dropped are done)."""
        if rows is None:
            rows = torch.arange(cur.batch, device=cur.done.device)
        final[0][rows], final[1][rows], final[2][rows] = cur.response, cur.resp_mask, cur.resp_lp
        keep = torch.argsort(cur.done.to(torch.int8), stable=True)[:target]  # live rows first, in order
        nxt = root.view(target)
        for src, dst in zip(cur.per_row(), nxt.per_row()):
            dst.copy_(src[keep])  # src[keep] is a copy: no overlap with the rows written
        return nxt, rows[keep]

    def _graph(self, st: _State, params: SamplingParams, gen, length: int) -> "torch.cuda.CUDAGraph":
        """``st``'s CUDA graph of one decode step over ``length`` cache slots, captured at first use.

        Warm-up and capture each run a step; the step buffers are restored after both, so capture
        mid-generation leaves the state as it was (the KV slot written is written again by the replay)."""
        g = st.graphs.get(length)
        if g is not None:
            return g
        snapshot = [t.clone() for t in st.step_buffers()]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            self._step(st, params, gen, length)  # warm-up (allocator, kernels, compilation)
        torch.cuda.current_stream().wait_stream(s)
        for dst, src in zip(st.step_buffers(), snapshot):
            dst.copy_(src)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self._step(st, params, gen, length)
        for dst, src in zip(st.step_buffers(), snapshot):
            dst.copy_(src)
        st.graphs[length] = g
        return g
