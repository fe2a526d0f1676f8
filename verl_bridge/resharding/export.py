"""Streaming, bucketed export of a TP/PP-sharded megatron-core model as full Hugging Face tensors.

Every rank of the TP x PP world builds a :class:`WeightExporter` over its own model chunk(s) and
iterates it at the same time; each rank receives every full, HF-named tensor. Per megatron
parameter, in one global order all ranks know:

1. the pipeline stage that owns it broadcasts each TP rank's shard over the PP group (ranks of
   other stages receive into a buffer of the shape learned from the one-off metadata exchange);
2. the TP shards are all-gathered over megatron's TP group and merged (:func:`merge_tp`);
3. :func:`mcore_to_hf` splits fused QKV (by query groups) and gate/up, drops the vocabulary
   padding, and skips the output layer of a tied model.

The order is config arithmetic (:func:`mcore_names` of the detected architecture); which stage
owns a name and the shard shapes come from one small ``all_gather_object`` over the PP group the
first time the stream is used (so VPP chunks and uneven stage layouts work too).

Memory: the exporter never holds more than one bucket of outputs plus the parameter in flight.
A parameter is converted only after the pending bucket is yielded if adding it could overflow
``bucket_bytes``; once the consumer resumes the generator, the bucket's tensors are dropped.
``stats.peak_extra_bytes`` is *measured*: at each step the exporter adds up the distinct storages
it holds (received shards, gather buffers, merged tensor, split outputs, pending bucket), leaving
out storages that belong to the model itself (a TP=1 owner streams its parameters without a
copy). The bound is ``max(bucket_bytes, F) + F`` where ``F`` is the largest full megatron tensor
(a tensor bigger than a bucket is its own bucket, plus one tensor in flight).

Fast path. When nothing has to move between ranks (TP=1 and PP=1: a single GPU, or data-parallel
replicas that each hold the whole model), the stream is a fixed plan built once and reused while the
parameters keep their storage (they are updated in place between syncs). Every HF tensor that is
a slice of a parameter (embeddings without the vocabulary padding, gate/up halves, norms, the
projections) is yielded as a view, with no copy and no per-tensor Python. Only the tensors that
are not contiguous in megatron's layout (q/k/v of a model with several query groups, or any
tensor cast by ``dtype``) are copied, with one batched ``torch._foreach_copy_`` per bucket, into a
fresh buffer split into those tensors. The buckets, their order and their contents are the same
as on the general path, and the exporter keeps views of the parameters between syncs (call
:meth:`WeightExporter.reset` after moving the model).

Coalesced general path (``coalesce=True``, the default; TP>1, PP>1 or ``fast_path=False``). The same
stream as the per-tensor general path, bit for bit, from a plan built once per layout (see
:class:`_CoalescedPlan`): the buckets are those of :func:`assign_buckets`; a unit of buckets (one
bucket, or the buckets a tensor larger than the cap spans) is gathered at once. Per unit and dtype,
this rank's shards are packed by one batched copy into its section of a preallocated gather buffer,
each pipeline stage that owns part of the unit broadcasts its part of that section over the PP group
(one broadcast per owning stage), and one in-place all-gather over the TP group fills the other ranks'
sections. The HF tensors are views of the gather buffer where the layout allows (TP=1, replicated
tensors, a column-parallel tensor alone in its unit) and otherwise land, by one batched copy per
bucket, in a preallocated output buffer (the TP merge, per rank, and the q/k/v split in one copy).
Memory: the two buffers, each about ``max(bucket_bytes, F)`` (the gather buffer also holds the
vocabulary padding and TP copies of replicated tensors), kept between syncs until :meth:`reset`.
``coalesce=False`` keeps the per-tensor path (one broadcast and one all-gather per parameter).

Mixture-of-Experts. Experts stream under their HF names with global expert indices (Mixtral's
``block_sparse_moe.experts.{e}.w1``, Qwen's ``mlp.experts.{e}.gate_proj``, ...). Under expert
parallelism (EP > 1) each rank holds ``E/ep`` experts (expert ``e`` on EP rank ``e // (E/ep)``): per
expert tensor, its EP rank broadcasts it over megatron's expert-model-parallel group (within the
owning pipeline stage), then the PP broadcast and the TP all-gather run as for any tensor (expert
TP = TP). At EP > 1 the bucketed stream takes the coalesced path (the fast path is for EP = 1), where
each unit's section holds, per owning stage, the experts of each EP rank as one run: one broadcast
per (EP rank, run) over the EP group, before the PP broadcasts and the TP all-gather; the stream
is the same as the per-tensor path's, name for name and bit for bit.

Yielded tensors may alias the model's parameters (zero copy) and must be treated as read-only;
clone them to keep them past the next training step. A yielded bucket list is emptied when the
consumer asks for the next one (so that a ``for bucket in ...`` loop does not keep two buckets
alive): copy what you want to keep (``[(n, t.clone()) for n, t in bucket]``) inside the loop body.
Every rank of the TP x PP world must iterate the stream to its end (it is a sequence of
collectives); the stream can be iterated again after every training step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Iterator, Optional, Union

import torch
import torch.distributed as dist

from verl_bridge.arch.convert import (
    VOCAB_PARAMS,
    ModelDims,
    is_gated_fc1,
    dims_of,
    hf_sources,
    mcore_names,
    mcore_to_hf,
    mcore_to_hf_parts,
    expert_index,
    merge_tp,
    to_global_name,
    tp_split_dim,
)
from verl_bridge.arch.registry import ArchSpec, detect_architecture, get_arch
from verl_bridge.compat import unwrap_model
from verl_bridge.distributed.state import model_parallel_state


@dataclass
class ExportStats:
    bytes: int = 0  # bytes of HF tensors produced
    tensors: int = 0
    buckets: int = 0
    peak_extra_bytes: int = 0  # measured peak of storages the exporter held (model storage excluded)
    seconds: float = 0.0  # time spent inside the exporter (consumer time between yields excluded)

    @property
    def gbps(self) -> float:
        """Export throughput in GB/s (1e9 bytes per second)."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


# Transformer Engine layer specs fuse the pre-attention / pre-MLP norms into the next linear layer;
# the architecture maps use the local spec's names. Norm weights are replicated across TP.
_TE_NORM_ALIASES = (
    (".self_attention.linear_qkv.layer_norm_weight", ".input_layernorm.weight"),
    (".self_attention.linear_qkv.layer_norm_bias", ".input_layernorm.bias"),
    (".mlp.linear_fc1.layer_norm_weight", ".pre_mlp_layernorm.weight"),
    (".mlp.linear_fc1.layer_norm_bias", ".pre_mlp_layernorm.bias"),
)


def local_spec_name(name: str) -> str:
    """The local-spec name of a megatron parameter (TE fused-norm names mapped back)."""
    for te, local in _TE_NORM_ALIASES:
        if name.endswith(te):
            return name[: -len(te)] + local
    return name


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _Ledger:
    """Measured live bytes: distinct storages held by the exporter, model storage left out."""

    def __init__(self, model_ptrs: set[int]):
        self.model_ptrs = model_ptrs
        self.peak = 0

    def mark(self, *groups, bucket: Optional["_Held"] = None) -> int:
        """Live bytes = distinct non-model storages in ``groups`` + what the pending bucket holds."""
        seen: dict[int, int] = {}
        held = bucket.ptrs if bucket is not None else {}
        for group in groups:
            for t in group:
                if t is None:
                    continue
                st = t.untyped_storage()
                ptr = st.data_ptr()
                if ptr in self.model_ptrs or ptr in seen or ptr in held:
                    continue
                seen[ptr] = st.nbytes()
        live = sum(seen.values()) + (bucket.total if bucket is not None else 0)
        self.peak = max(self.peak, live)
        return live


class _Held:
    """Distinct non-model storages of the pending bucket, kept incrementally (O(1) per tensor)."""

    def __init__(self, model_ptrs: set[int]):
        self.model_ptrs = model_ptrs
        self.ptrs: dict[int, int] = {}
        self.total = 0

    def add(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in self.model_ptrs and ptr not in self.ptrs:
            self.ptrs[ptr] = st.nbytes()
            self.total += st.nbytes()

    def clear(self) -> None:
        self.ptrs.clear()
        self.total = 0


def _parallel_state():
    """(tp_size, tp_rank, tp_group, pp_size, pp_rank, pp_group, pp_ranks); a world of one without megatron's groups."""
    ps = model_parallel_state()
    if ps is None:
        return 1, 0, None, 1, 0, None, [0]
    return ps.tp_size, ps.tp_rank, ps.tp_group, ps.pp_size, ps.pp_rank, ps.pp_group, list(ps.pp_ranks)


def _ep_state():
    """(ep_size, ep_rank, ep_group, global ranks of the EP group, expert TP size); (1, 0, None, [0], 1)
    without megatron's groups."""
    ps = model_parallel_state()
    if ps is None or ps.ep_size == 1:
        return 1, 0, None, [0], 1 if ps is None else ps.etp_size
    return ps.ep_size, ps.ep_rank, ps.ep_group, list(dist.get_process_group_ranks(ps.ep_group)), ps.etp_size


def assign_buckets(entries: list[tuple[int, list[int]]], bucket_bytes: int) -> list[list[tuple[int, int]]]:
    """The buckets the stream sends, as ``(entry index, piece index)`` lists.

    ``entries``: per megatron parameter in stream order, ``(full bytes, [bytes of each HF piece])``.
    A parameter starts a new bucket if its full size could overflow the pending one; its pieces
    (q/k/v, gate/up) may then straddle buckets; a piece bigger than the cap is a bucket of its own.
    """
    buckets: list[list[tuple[int, int]]] = []
    cur: list[tuple[int, int]] = []
    held = 0
    for i, (full, pieces) in enumerate(entries):
        if cur and held + full > bucket_bytes:
            buckets.append(cur)
            cur, held = [], 0
        for j, size in enumerate(pieces):
            if cur and held + size > bucket_bytes:
                buckets.append(cur)
                cur, held = [], 0
            cur.append((i, j))
            held += size
    if cur:
        buckets.append(cur)
    return buckets


@dataclass
class _Staged:
    """The copied tensors of one bucket that share a dtype: one fresh buffer per sync, split.

    Each copied HF tensor is made of ``pieces``: contiguous slices of the parameter (for q/k/v,
    one slice per query group), so one ``torch._foreach_copy_`` over flat views moves them all
    (the multi-tensor kernel: a few launches per bucket, not one per piece). A piece that is not
    contiguous (an unusual layout) is copied on its own.
    """
    dtype: torch.dtype
    index: list  # positions in the bucket's item list
    numels: list  # per copied HF tensor
    shapes: list  # HF shapes
    piece_numels: list  # per piece, in buffer order
    by_src_dtype: dict  # source dtype -> ([piece positions], [flat contiguous slices]): one copy call each
    strided: list  # (piece position, strided parameter view)


@dataclass
class _PlannedBucket:
    items: list  # (hf_name, parameter view), or (hf_name, None) where the tensor is made per sync
    staged: list  # _Staged per dtype
    recompute: list  # (item index, megatron name, piece index): pieces with no parameter slice
    nbytes: int


def _pieces(part: torch.Tensor) -> list[torch.Tensor]:
    """``part`` as contiguous slices along its first dimension, in order (or itself if strided)."""
    if part.is_contiguous():
        return [part]
    if part.dim() > 1 and all(p.is_contiguous() for p in part.unbind(0)):
        return list(part.unbind(0))
    return [part]


class _Plan:
    """The TP=1 / PP=1 stream as fixed buckets of parameter views and batched copies."""

    def __init__(self, exporter: "WeightExporter", local: dict[str, torch.Tensor]):
        ex = exporter
        self.peak_extra_bytes = 0
        convs, entries = [], []
        for name in ex.order:
            src = local[name]
            dt = ex.dtype or src.dtype
            ptr = src.untyped_storage().data_ptr()
            conv = []
            for hf_name, part, shape in mcore_to_hf_parts(name, src, ex.spec, ex.dims, extras=ex.hf_extras):
                shares = part.untyped_storage().data_ptr() == ptr
                view = _as_view(part, shape) if shares and part.dtype == dt else None
                kind = "view" if view is not None else "copy" if shares else "recompute"
                conv.append((kind, hf_name, view if view is not None else part, shape, dt))
            convs.append((name, conv))
            entries.append((ex._full_bytes(name, tuple(src.shape), src.dtype, 1),
                            [math.prod(shape) * dt.itemsize for *_, shape, _dt in conv]))
        self.buckets: list[_PlannedBucket] = []
        for members in assign_buckets(entries, ex.bucket_bytes):
            items, staged, recompute, nbytes, extra = [], {}, [], 0, 0
            for i, j in members:
                name, conv = convs[i]
                kind, hf_name, t, shape, dt = conv[j]
                nbytes += entries[i][1][j]
                items.append((hf_name, t if kind == "view" else None))
                if kind == "copy":
                    g = staged.setdefault(dt, _Staged(dt, [], [], [], [], {}, []))
                    g.index.append(len(items) - 1)
                    g.numels.append(math.prod(shape))
                    g.shapes.append(shape)
                    for piece in _pieces(t):
                        if piece.is_contiguous():
                            positions, srcs = g.by_src_dtype.setdefault(piece.dtype, ([], []))
                            positions.append(len(g.piece_numels))
                            srcs.append(piece.view(-1))
                        else:
                            g.strided.append((len(g.piece_numels), piece))
                        g.piece_numels.append(piece.numel())
                    extra += entries[i][1][j]
                elif kind == "recompute":
                    recompute.append((len(items) - 1, name, j))
                    extra += entries[i][1][j]
            self.peak_extra_bytes = max(self.peak_extra_bytes, extra)
            self.buckets.append(_PlannedBucket(items, list(staged.values()), recompute, nbytes))


def _as_view(part: torch.Tensor, shape) -> Optional[torch.Tensor]:
    """``part`` as a contiguous tensor of ``shape`` without copying, or None if that needs a copy."""
    try:
        v = part.view(shape)
    except RuntimeError:
        return None
    return v if v.is_contiguous() else None



# ---- the general path, coalesced (TP > 1 / PP > 1) ------------------------------------------

def _gather_into(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    """All-gather ``inp`` (this rank's section of ``out``, in place) into ``out``."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


@dataclass
class _Unit:
    """One communication unit: the buckets that share a gather buffer (a parameter larger than a
    bucket spans several). Per dtype: one packing copy, a broadcast per owning stage, one all-gather."""
    pack: list  # (dsts, srcs) per source dtype: this rank's shards into its own section
    bcasts: list  # (section view, global source rank)
    gathers: list  # (buffer view [tp * L], own section view [L])
    buckets: list  # _PlannedBucket-like: (items, copies, recompute, nbytes)
    ep_bcasts: list = field(default_factory=list)  # (section view, global source rank): experts over EP, first


class _CoalescedPlan:
    """The general path as a plan built once: per unit of buckets and per dtype, the shards are
    packed into one preallocated buffer (this rank's section), each owning pipeline stage broadcasts
    its part of it over the PP group, one in-place all-gather over the TP group fills the other
    sections, and the HF tensors are views of that buffer where the layout allows (TP=1 or a
    replicated tensor: everything but multi-group q/k/v) or batched copies into a second
    preallocated buffer (the merge of TP shards, per rank)."""

    def __init__(self, ex: "WeightExporter", local: dict, meta: dict, ps, device):
        tp, tp_rank, _, pp, pp_rank, _, pp_ranks = ps
        _, ep_rank, _, ep_ranks, _ = _ep_state()
        self.tp = tp
        dims_r = replace(ex.dims, num_attention_heads=ex.dims.num_attention_heads // tp,
                         num_query_groups=ex.dims.num_query_groups // tp, vocab_size=None)
        info, entries = [], []
        for name in ex.order:
            owner, shape, dt0 = meta[name]
            dt = ex.dtype or dt0
            split = tp_split_dim(name) if tp > 1 else None
            full = list(shape)
            if split is not None:
                full[split] *= tp
            probe = torch.empty(full, dtype=dt, device="meta")
            pieces = [(n, s) for n, _, s in mcore_to_hf_parts(name, probe, ex.spec, ex.dims, extras=ex.hf_extras)]
            info.append((name, owner, tuple(shape), dt, split, tuple(full), pieces))
            entries.append((math.prod(full) * dt.itemsize, [math.prod(s) * dt.itemsize for _, s in pieces]))
        buckets = assign_buckets(entries, ex.bucket_bytes)
        # units: runs of buckets linked by a parameter whose pieces straddle them
        units: list[list[list]] = []
        last_param = -1
        for b in buckets:
            if units and b[0][0] == last_param:
                units[-1].append(b)
            else:
                units.append([b])
            last_param = b[-1][0]
        # layouts: per unit and dtype, parameters ordered by owning stage, then stream order
        layouts, g_numel = [], {}
        for ub in units:
            params = sorted({i for b in ub for i, _ in b},
                            key=lambda i: (info[i][1], ex._ep_owner.get(info[i][0], -1), i))
            lay: dict = {}  # dtype -> [section length, [(parameter index, offset)]]
            for i in params:
                slot = lay.setdefault(info[i][3], [0, []])
                slot[1].append((i, slot[0]))
                slot[0] += math.prod(info[i][2])
            for dt, (length, _) in lay.items():
                g_numel[dt] = max(g_numel.get(dt, 0), tp * length)
            layouts.append(lay)
        self.gbuf = {dt: torch.empty(n, dtype=dt, device=device) for dt, n in g_numel.items()}
        # first pass: every HF piece as a view of the gather buffer, or copies into the out buffer
        o_numel: dict = {}
        pending_units = []
        for ub, lay in zip(units, layouts):
            where = {}
            pack: dict = {}
            bcasts, gathers, ep_bcasts = [], [], []
            for dt, (length, placed) in lay.items():
                g2 = self.gbuf[dt][: tp * length].view(tp, length)
                own = g2[tp_rank]
                if tp > 1:
                    gathers.append((g2.view(-1), own))
                runs: list = []  # (owner, start, end)
                ep_runs: list = []  # (EP owner, start, end) of this stage's experts
                for i, off in placed:
                    name, owner, shape, _, _, _, _ = info[i]
                    n = math.prod(shape)
                    where[i] = (g2, off, n)
                    q = ex._ep_owner.get(name)
                    if owner == pp_rank and q in (None, ep_rank):
                        d, s = pack.setdefault(local[name].dtype, ([], []))
                        d.append(own[off:off + n].view(shape))
                        s.append(local[name])
                    if runs and runs[-1][0] == owner:
                        runs[-1][2] = off + n
                    else:
                        runs.append([owner, off, off + n])
                    if q is not None and owner == pp_rank:
                        if ep_runs and ep_runs[-1][0] == q and ep_runs[-1][2] == off:
                            ep_runs[-1][2] = off + n
                        else:
                            ep_runs.append([q, off, off + n])
                ep_bcasts += [(own[a:b], ep_ranks[q]) for q, a, b in ep_runs]
                if pp > 1:
                    bcasts += [(own[a:b], pp_ranks[o]) for o, a, b in runs]
            planned = []
            for b in ub:
                items, copies, recompute, nbytes, o_used = [], [], [], 0, {}
                for i, j in b:
                    name, owner, shape, dt, split, full, pieces = info[i]
                    hf_name, hf_shape = pieces[j]
                    nbytes += entries[i][1][j]
                    g2, off, n = where[i]
                    sh = g2[:, off:off + n].view((tp,) + shape)  # every rank's shard
                    fullv = None
                    if split is None:
                        fullv = sh[tp_rank]
                    elif split == 0 and not is_gated_fc1(name, ex.dims):
                        try:  # the shards lie end to end (the parameter is alone in its section)
                            fullv = sh.view(full)
                        except RuntimeError:
                            fullv = None
                    if fullv is not None:
                        _, part, _ = mcore_to_hf_parts(name, fullv, ex.spec, ex.dims, extras=ex.hf_extras)[j]
                        if part.untyped_storage().data_ptr() != g2.untyped_storage().data_ptr():
                            items.append((hf_name, None))  # made per sync (OPT's position rows)
                            recompute.append((len(items) - 1, name, j, fullv))
                            continue
                        view = _as_view(part, hf_shape)
                        if view is not None:
                            items.append((hf_name, view))
                            continue
                        srcs = [part]
                        layout = "whole"
                    elif split == 1:  # row-parallel: the full tensor is the shards side by side
                        srcs = [sh.transpose(0, 1)]
                        layout = "cols"
                    else:  # column-parallel: the HF tensor is each rank's piece, rank after rank
                        vocab = name in VOCAB_PARAMS and ex.dims.vocab_size is not None
                        srcs = [mcore_to_hf_parts(name, sh[r], ex.spec, dims_r)[j][1] for r in range(tp)]
                        layout = ("vocab", shape[0]) if vocab else "rows"
                    start = o_used.get(dt, 0)
                    o_used[dt] = start + math.prod(hf_shape)
                    items.append((hf_name, None))
                    copies.append((len(items) - 1, dt, start, hf_shape, layout, srcs))
                for dt, used in o_used.items():
                    o_numel[dt] = max(o_numel.get(dt, 0), used)
                planned.append((items, copies, recompute, nbytes))
            pending_units.append((pack, bcasts, gathers, planned, ep_bcasts))
        self.obuf = {dt: torch.empty(n, dtype=dt, device=device) for dt, n in o_numel.items()}
        self.peak_extra_bytes = sum(_nbytes(t) for t in (*self.gbuf.values(), *self.obuf.values()))
        # second pass: destination views in the out buffer, batched per (dtype pair)
        self.units: list[_Unit] = []
        for pack, bcasts, gathers, planned, ep_bcasts in pending_units:
            bks = []
            for items, copies, recompute, nbytes in planned:
                items = list(items)
                groups: dict = {}
                for k, dt, start, hf_shape, layout, srcs in copies:
                    dst = self.obuf[dt][start:start + math.prod(hf_shape)].view(hf_shape)
                    items[k] = (items[k][0], dst)
                    if layout == "whole":
                        pairs = [(dst.view(srcs[0].shape), srcs[0])]
                    elif layout == "cols":
                        pairs = [(dst.view(hf_shape[0], tp, -1), srcs[0])]
                    elif layout == "rows":
                        per = dst.view(tp, -1)
                        pairs = [(per[r].view(srcs[r].shape), srcs[r]) for r in range(tp)]
                    else:  # vocabulary rows: rank r holds rows [r * a, (r + 1) * a), the padding dropped
                        a = layout[1]
                        pairs = []
                        for r in range(tp):
                            rows = max(0, min(a, hf_shape[0] - r * a))
                            if rows:
                                pairs.append((dst[r * a:r * a + rows], srcs[r][:rows]))
                    for d, s in pairs:
                        gd, gs = groups.setdefault(dt, ([], []))
                        gd.append(d)
                        gs.append(s)
                bks.append(_PlannedBucket(items, list(groups.values()), recompute, nbytes))
            self.units.append(_Unit([tuple(v) for v in pack.values()], bcasts, gathers, bks, ep_bcasts))


class WeightExporter:
    """Full, HF-named tensors of a (TP/PP/VPP-sharded) megatron-core GPTModel, streamed in buckets.

    ``model_chunks``: this rank's GPTModel, or a list of them (virtual pipeline chunks).
    ``arch``: architecture name or :class:`ArchSpec` (default: :func:`detect_architecture`).
    ``bucket_bytes``: upper bound on a bucket's bytes (``rollout.bucket_mb << 20``).
    ``dtype``: cast shards to this dtype before they move (e.g. ``torch.bfloat16``).
    ``vocab_size``: the unpadded (HF) vocabulary; rows past it are dropped. Default: the model's
    ``hf_vocab_size`` attribute if set, else the padded vocabulary is kept.
    ``checksum``: fill ``self.checksums`` (HF name -> fingerprint, see
    :func:`verl_bridge.rollout.verify.tensor_checksums`) on the sending side during export.
    ``hf_extras``: HF data megatron has no place for (OPT's leading position rows).
    ``fast_path``: at TP=1 and PP=1, stream a plan of views built once (see the module docstring);
    ``False`` forces the general path (same stream, per-tensor work every sync).
    ``coalesce``: the general path of :meth:`iter_buckets` (TP>1 or PP>1, or ``fast_path=False``)
    runs a plan built once: per bucket one packing copy, one broadcast per owning pipeline stage,
    one in-place all-gather over TP, HF tensors as views of the received buffer where the layout
    allows and one batched copy for the rest (see :class:`_CoalescedPlan`). Its two buffers
    (about ``2 * max(bucket_bytes, F)``) are kept between syncs until :meth:`reset`. ``False``:
    the per-tensor general path (one broadcast / all-gather per parameter, nothing kept).
    :meth:`iter_tensors` always streams one parameter at a time.
    """

    def __init__(self, model_chunks, *, arch: Union[str, ArchSpec, None] = None, bucket_bytes: int = 256 << 20,
                 dtype: Optional[torch.dtype] = None, vocab_size: Optional[int] = None, checksum: bool = False,
                 hf_extras: Optional[dict] = None, fast_path: bool = True, coalesce: bool = True):
        self.fast_path = fast_path
        self.coalesce = coalesce
        chunks = model_chunks if isinstance(model_chunks, (list, tuple)) else [model_chunks]
        if not chunks:
            raise ValueError("WeightExporter needs at least one model chunk")
        self.chunks = [unwrap_model(c) for c in chunks]
        first = self.chunks[0]
        self.spec = get_arch(arch if arch is not None else detect_architecture(first))
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.bucket_bytes = int(bucket_bytes)
        self.dtype = dtype
        padded = getattr(first, "vocab_size", None)
        vocab = vocab_size if vocab_size is not None else getattr(first, "hf_vocab_size", None)
        base = dims_of(first.config)
        self.dims = ModelDims(**{**base.__dict__, "vocab_size": vocab if vocab is not None else padded,
                                 "padded_vocab_size": padded,
                                 "tie_embeddings": bool(getattr(first, "share_embeddings_and_output_weights",
                                                                base.tie_embeddings))})
        self.order = mcore_names(self.spec, self.dims)
        self.checksum = checksum
        self.checksums: dict[str, float] = {}
        self.hf_extras = hf_extras
        self.stats = ExportStats()
        self._meta: Optional[dict] = None  # global name -> (owner pp rank, shard shape, dtype)
        self._ep_owner: dict[str, int] = {}  # expert name -> the EP rank holding it (expert parallelism)
        self._plan: Optional[_Plan] = None  # the TP=1 / PP=1 fast path (see the module docstring)
        self._plan_key = None
        self._cplan: Optional[_CoalescedPlan] = None  # the coalesced general path
        self._cplan_key = None
        self._local_key = None
        self._params: Optional[list] = None

    # ---- names ----------------------------------------------------------------------------
    def hf_names(self) -> list[str]:
        """Every HF name the stream produces, in order (pure arithmetic, no communication)."""
        out = []
        for name in self.order:
            if name == "output_layer.weight" and self.dims.tie_embeddings:
                continue
            out += hf_sources(name, self.spec)
        return out

    def _local_tensors(self) -> dict[str, torch.Tensor]:
        """Global megatron name -> this rank's (TP-shard) tensor, over all chunks."""
        known = set(self.order)
        local: dict[str, torch.Tensor] = {}
        ep_size, ep_rank = _ep_state()[:2]
        n_local = self.dims.num_experts // ep_size if self.dims.num_experts else None
        for chunk in self.chunks:
            layers = getattr(getattr(chunk, "decoder", None), "layers", None)
            offset = (layers[0].layer_number - 1) if layers is not None and len(layers) else 0
            for lname, t in chunk.state_dict(keep_vars=True).items():
                if lname.endswith("._extra_state") or t is None:
                    continue
                g = local_spec_name(to_global_name(lname, offset, ep_rank=ep_rank, num_local_experts=n_local))
                if g == "output_layer.weight" and self.dims.tie_embeddings:
                    continue  # the last stage's copy of the tied embeddings
                if g not in known:
                    raise ValueError(f"parameter {lname} (global {g}) is not in the {self.spec.name} "
                                     "architecture map; register an architecture that maps it")
                local[g] = t.detach()
        return local

    def _cached_local(self) -> tuple[dict[str, torch.Tensor], set[int]]:
        """Local tensors and the model's storage pointers, rebuilt only when a parameter moved.

        Walking ``state_dict`` costs milliseconds per sync on a 24-layer model; the parameters are
        updated in place between syncs, so their objects and storages normally stay the same.
        """
        if all(isinstance(c, torch.nn.Module) for c in self.chunks):
            if self._params is None:  # walking the module tree each sync costs more than the key
                self._params = [p for c in self.chunks for p in c.parameters()]
            key = tuple(p.data_ptr() for p in self._params)
        else:  # duck-typed chunks (anything with state_dict): no cache
            key = object()
        if self._local_key != key:
            local = self._local_tensors()
            ptrs = {t.untyped_storage().data_ptr() for c in self.chunks
                    for t in c.state_dict(keep_vars=True).values() if isinstance(t, torch.Tensor)}
            self._local_cache, self._local_key = (local, ptrs), key
        return self._local_cache

    def _metadata(self) -> dict:
        """Owner stage, shard shape and dtype of every name (one all_gather_object over PP)."""
        if self._meta is not None:
            return self._meta
        _, _, _, pp_size, _, pp_group, _ = _parallel_state()
        mine = {g: (tuple(t.shape), t.dtype) for g, t in self._local_tensors().items()}
        if pp_size > 1:
            stages: list = [None] * pp_size
            dist.all_gather_object(stages, mine, group=pp_group)
        else:
            stages = [mine]
        meta = {}
        for p, entries in enumerate(stages):
            for g, (shape, dt) in entries.items():
                if g in meta:
                    raise ValueError(f"{g} is held by pipeline stages {meta[g][0]} and {p}")
                meta[g] = (p, shape, dt)
        ep_size, ep_rank, ep_group, _, etp_size = _ep_state()
        self._ep_owner: dict[str, int] = {}
        if ep_size > 1:  # experts: each EP rank of a stage holds its own; the rest of the model is replicated
            tp_size = _parallel_state()[0]
            if etp_size != tp_size:
                raise ValueError(f"exporting experts with expert_tensor_parallel_size={etp_size} != TP={tp_size} "
                                 "is not supported; use the default expert TP (= TP)")
            per_ep: list = [None] * ep_size
            dist.all_gather_object(per_ep, {g: v for g, v in meta.items() if expert_index(g) is not None},
                                   group=ep_group)
            for q, entries in enumerate(per_ep):
                for g, v in entries.items():
                    if g in self._ep_owner and self._ep_owner[g] != q:
                        raise ValueError(f"{g} is held by EP ranks {self._ep_owner[g]} and {q}")
                    self._ep_owner[g] = q
                    meta[g] = v
        missing = [g for g in self.order if g not in meta]
        if missing:
            raise ValueError(f"no pipeline stage holds {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        self._meta = meta
        return meta

    # ---- streaming ------------------------------------------------------------------------
    def _full_bytes(self, name: str, shape, dt, tp_size: int) -> int:
        n = math.prod(shape) * (tp_size if tp_split_dim(name) is not None else 1)
        return n * (self.dtype or dt).itemsize

    def _convert(self, name, local, meta, ps, ledger, held) -> list[tuple[str, torch.Tensor]]:
        tp_size, tp_rank, tp_group, pp_size, pp_rank, pp_group, pp_ranks = ps
        owner, shape, dt = meta[name]
        dt = self.dtype or dt
        ep_owner = self._ep_owner.get(name)
        ep_size, ep_rank, ep_group, ep_ranks, _ = _ep_state()
        if owner == pp_rank and (ep_owner is None or ep_owner == ep_rank):
            shard = local[name]
            if shard.dtype != dt:
                shard = shard.to(dt)
            shard = shard.contiguous()
        else:
            shard = torch.empty(shape, dtype=dt, device=self._device)
        if ep_owner is not None and owner == pp_rank:  # an expert: its EP rank sends it to the stage's others
            dist.broadcast(shard, src=ep_ranks[ep_owner], group=ep_group)
        if pp_size > 1:
            dist.broadcast(shard, src=pp_ranks[owner], group=pp_group)
        if tp_size > 1 and tp_split_dim(name) is not None:
            shards = [shard if r == tp_rank else torch.empty_like(shard) for r in range(tp_size)]
            dist.all_gather(shards, shard, group=tp_group)
            ledger.mark(shards, bucket=held)
            merged = merge_tp(name, shards, self.dims)
            ledger.mark(shards, [merged], bucket=held)
            del shards
        else:
            merged = shard
        del shard
        outs = mcore_to_hf(name, merged, self.spec, self.dims, extras=self.hf_extras)
        used: dict[int, int] = {}
        for _, t in outs:
            ptr = t.untyped_storage().data_ptr()
            used[ptr] = used.get(ptr, 0) + _nbytes(t)
        fixed = []
        for hf_name, t in outs:
            st = t.untyped_storage()
            if st.data_ptr() not in ledger.model_ptrs and st.nbytes() > used[st.data_ptr()]:
                # a view into a larger buffer (vocabulary padding dropped): keep only what is needed
                ledger.mark([merged, t], bucket=held)
                t = t.clone()
            fixed.append((hf_name, t))
        ledger.mark([merged], [t for _, t in fixed], bucket=held)
        del merged, outs
        return fixed

    def _stream(self, bucketed: bool) -> Iterator[list[tuple[str, torch.Tensor]]]:
        start = time.perf_counter()
        paused = 0.0
        ps = _parallel_state()
        meta = self._metadata()
        local, model_ptrs = self._cached_local()
        self._device = next(iter(local.values())).device if local else torch.device("cpu")
        ep_size = _ep_state()[0]
        if bucketed and self.fast_path and ps[0] == 1 and ps[3] == 1 and ep_size == 1 \
                and isinstance(self._local_key, tuple):
            yield from self._stream_planned(local, start)
            return
        if bucketed and self.coalesce:
            yield from self._stream_coalesced(local, meta, ps, start)
            return
        ledger = _Ledger(model_ptrs)
        pending = _Held(model_ptrs)
        stats = ExportStats()
        self.stats = stats
        if self.checksum:
            from verl_bridge.rollout.verify import tensor_checksums
            self.checksums = {}
        bucket: list[tuple[str, torch.Tensor]] = []
        held = 0

        def emit(items):
            nonlocal paused
            stats.buckets += 1
            stats.peak_extra_bytes = max(stats.peak_extra_bytes, ledger.peak)
            stats.seconds = time.perf_counter() - start - paused
            t0 = time.perf_counter()
            yield items
            paused += time.perf_counter() - t0
            # the consumer asked for more: drop the tensors it was given, also from ITS reference to
            # the list (a `for bucket in ...` loop variable would otherwise keep the previous bucket
            # alive while the next one is built: two buckets instead of one)
            items.clear()

        for name in self.order:
            _, shape, dt = meta[name]
            est = self._full_bytes(name, shape, dt, ps[0])
            if bucketed and bucket and held + est > self.bucket_bytes:
                yield from emit(bucket)
                bucket, held = [], 0
                pending.clear()
            outs = self._convert(name, local, meta, ps, ledger, pending)
            for hf_name, t in outs:
                stats.tensors += 1
                stats.bytes += _nbytes(t)
                if self.checksum:
                    self.checksums.update(tensor_checksums([(hf_name, t)]))
            if not bucketed:
                if outs:
                    yield from emit(outs)
                del outs
                continue
            for item in outs:  # a parameter's parts (q/k/v, gate/up) may straddle buckets
                size = _nbytes(item[1])
                if bucket and held + size > self.bucket_bytes:
                    yield from emit(bucket)
                    bucket, held = [], 0
                    pending.clear()
                bucket.append(item)
                pending.add(item[1])
                held += size
            item = None
            del outs
        if bucket:
            yield from emit(bucket)
        del bucket
        stats.peak_extra_bytes = max(stats.peak_extra_bytes, ledger.peak)
        stats.seconds = time.perf_counter() - start - paused

    def _stream_planned(self, local, start: float) -> Iterator[list[tuple[str, torch.Tensor]]]:
        if self._plan is None or self._plan_key != self._local_key:
            self._plan, self._plan_key = _Plan(self, local), self._local_key
        stats = ExportStats(peak_extra_bytes=self._plan.peak_extra_bytes)
        self.stats = stats
        if self.checksum:
            from verl_bridge.rollout.verify import tensor_checksums
            self.checksums = {}
        paused = 0.0
        for b in self._plan.buckets:
            items = list(b.items)
            for g in b.staged:  # one buffer per dtype, split into the HF tensors, filled by one call
                flat = torch.empty(sum(g.numels), dtype=g.dtype, device=self._device)
                dsts = flat.split(g.piece_numels)
                for pos, piece in g.strided:
                    dsts[pos].view(piece.shape).copy_(piece)
                for positions, srcs in g.by_src_dtype.values():
                    torch._foreach_copy_(dsts if len(positions) == len(dsts) else [dsts[p] for p in positions], srcs)
                for k, part, shape in zip(g.index, flat.split(g.numels), g.shapes):
                    items[k] = (items[k][0], part.view(shape))
                del flat, dsts
            for k, name, j in b.recompute:  # a piece with no parameter slice (OPT's position rows)
                t = mcore_to_hf(name, local[name], self.spec, self.dims, extras=self.hf_extras)[j][1]
                items[k] = (items[k][0], t.to(self.dtype or t.dtype))
            stats.buckets += 1
            stats.tensors += len(items)
            stats.bytes += b.nbytes
            if self.checksum:
                self.checksums.update(tensor_checksums(items))
            stats.seconds = time.perf_counter() - start - paused
            t0 = time.perf_counter()
            yield items
            paused += time.perf_counter() - t0
            items.clear()  # as on the general path: the consumer's reference to the list holds nothing
        stats.seconds = time.perf_counter() - start - paused

    def _stream_coalesced(self, local, meta, ps, start: float) -> Iterator[list[tuple[str, torch.Tensor]]]:
        tp_size, tp_rank, tp_group, pp_size, pp_rank, pp_group, _ = ps
        ep_group = _ep_state()[2]
        key = (self._local_key, tp_size, tp_rank, pp_size, pp_rank, self.bucket_bytes, self.dtype)
        if self._cplan is None or self._cplan_key != key or not isinstance(self._local_key, tuple):
            self._cplan = None  # free the old buffers before the new ones are allocated
            self._cplan, self._cplan_key = _CoalescedPlan(self, local, meta, ps, self._device), key
        plan = self._cplan
        stats = ExportStats(peak_extra_bytes=plan.peak_extra_bytes)
        self.stats = stats
        if self.checksum:
            from verl_bridge.rollout.verify import tensor_checksums
            self.checksums = {}
        paused = 0.0
        for u in plan.units:
            for dsts, srcs in u.pack:  # this rank's shards into its section, one batched copy per dtype
                torch._foreach_copy_(dsts, srcs)
            for view, src in u.ep_bcasts:  # experts: each EP rank's run of its experts, within the stage
                dist.broadcast(view, src=src, group=ep_group)
            for view, src in u.bcasts:  # one broadcast per owning stage
                dist.broadcast(view, src=src, group=pp_group)
            for out, own in u.gathers:  # one all-gather of the whole section per dtype
                _gather_into(out, own, tp_group)
            for b in u.buckets:
                items = list(b.items)
                for dsts, srcs in b.staged:
                    torch._foreach_copy_(dsts, srcs)
                for k, name, j, full in b.recompute:  # a piece with no slice of the buffer (OPT's rows)
                    items[k] = (items[k][0], mcore_to_hf(name, full, self.spec, self.dims, extras=self.hf_extras)[j][1])
                stats.buckets += 1
                stats.tensors += len(items)
                stats.bytes += b.nbytes
                if self.checksum:
                    self.checksums.update(tensor_checksums(items))
                stats.seconds = time.perf_counter() - start - paused
                t0 = time.perf_counter()
                yield items
                paused += time.perf_counter() - t0
                items.clear()
        stats.seconds = time.perf_counter() - start - paused

    def iter_buckets(self) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Lists of ``(hf_name, tensor)`` whose bytes stay within ``bucket_bytes`` (a larger tensor alone)."""
        return self._stream(bucketed=True)

    def iter_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, full tensor)`` one at a time, on every rank (only one parameter in flight)."""
        for items in self._stream(bucketed=False):
            yield from items

    def reset(self) -> None:
        """Forget the cached parameter views and plan (they keep the parameters' storage alive):
        call it after moving the model, e.g. offloading it, if the exporter outlives that storage."""
        self._plan = self._plan_key = self._local_key = self._params = None
        self._cplan = self._cplan_key = None
        self.__dict__.pop("_local_cache", None)

    def largest_tensor_bytes(self) -> int:
        """Bytes of the largest full megatron tensor (the ``F`` of the memory bound)."""
        meta = self._metadata()
        tp = _parallel_state()[0]
        return max(self._full_bytes(n, meta[n][1], meta[n][2], tp) for n in self.order)

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        """Convenience for tests and small models: the whole stream as one dict (NOT bounded)."""
        return {n: t.clone() for n, t in self.iter_tensors()}


__all__ = ["ExportStats", "WeightExporter", "assign_buckets"]

